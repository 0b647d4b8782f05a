def reduce_0(data0, data1):
    for gid in range(15):
        v0 = (_remainder(gid, 5))
        v1 = (_integer_divide(gid, 5))
        v2 = (v1 * 85)
        acc3 = 0.0
        for loop1 in range(17):
            v5 = (loop1 * 5)
            v6 = (v5 + v2)
            v7 = (v0 + v6)
            v8 = data1[v7]
            acc3 = _f32((acc3 + v8))
        data0[gid] = acc3
