def small_types_0(data0, data1, data2):
    for gid in range(6):
        v0 = data1[gid]
        v1 = (_cast(v0, 'float32'))
        v2 = data2[gid]
        v3 = _wrap((v2 * 3), 8, True)
        v4 = (_cast(v3, 'float16'))
        v5 = (_cast(v4, 'float32'))
        v6 = (v1 < v5)
        data0[gid] = v6
