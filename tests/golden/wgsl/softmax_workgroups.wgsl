var<private> ember_zero: u32;  // 0 at run time, unknown to the compiler (set from id.z)
fn ember_opaque_f32(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) | ember_zero); }
fn ember_isnan_f32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn ember_lt_f32(a: f32, b: f32) -> bool { return a < b && !ember_isnan_f32(a) && !ember_isnan_f32(b); }
fn ember_eq_f32(a: f32, b: f32) -> bool { return a == b && !ember_isnan_f32(a) && !ember_isnan_f32(b); }
fn ember_max_f32(a: f32, b: f32) -> f32 { return select(b, a, ember_isnan_f32(a) || (a > b && !ember_isnan_f32(b))); }
fn ember_nonzero_f32(x: f32) -> bool { return x != 0.0f || ember_isnan_f32(x); }
@group(0) @binding(0) var<storage, read_write> data0: array<f32>;
@group(0) @binding(1) var<storage, read> data1: array<f32>;
var<workgroup> ember_shared9: array<f32, 256>;
var<workgroup> ember_shared105: array<f32, 256>;
@compute @workgroup_size(256)
fn softmax_workgroups_0(@builtin(global_invocation_id) id: vec3<u32>, @builtin(local_invocation_index) local_index: u32, @builtin(workgroup_id) workgroup: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
  ember_zero = id.z;
  let ember_group = i32(workgroup.x + workgroup.y * groups.x);
  if (ember_group >= 2i) { return; }
  let ember_lid = i32(local_index);
  let v0: i32 = (ember_group * 300i);
  var acc1: f32 = bitcast<f32>(0xff800000u);
  for (var loop2: i32 = 0i; loop2 < 2i; loop2++) {
    let v2: i32 = (loop2 * 256i);
    let v3: i32 = (v2 + ember_lid);
    let v4: bool = (v3 < 300i);
    let v5: i32 = select(299i, v3, v4);
    let v6: i32 = (v5 + v0);
    let v7: f32 = data1[v6];
    let v8: f32 = select(bitcast<f32>(0xff800000u), v7, v4);
    acc1 = ember_max_f32(acc1, v8);
  }
  ember_shared9[ember_lid] = acc1;
  workgroupBarrier();
  for (var stride9: i32 = 128i; stride9 > 0i; stride9 = stride9 >> 1u) {
    if (ember_lid < stride9) { ember_shared9[ember_lid] = ember_max_f32(ember_shared9[ember_lid], ember_shared9[ember_lid + stride9]); }
    workgroupBarrier();
  }
  let g10: f32 = ember_shared9[0];
  var acc11: f32 = 0.0f;
  for (var loop3: i32 = 0i; loop3 < 2i; loop3++) {
    let v12: i32 = (loop3 * 256i);
    let v13: i32 = (v12 + ember_lid);
    let v14: bool = (v13 < 300i);
    let v15: i32 = select(299i, v13, v14);
    let v16: i32 = (v15 + v0);
    let v17: f32 = data1[v16];
    let v18: f32 = ember_opaque_f32(v17 - g10);
    let v19: bool = ember_lt_f32(v18, -105.0f);
    let v20: f32 = select(v18, 0.0f, v19);
    let v21: f32 = (v20 * 1.4426950216293335f);
    let v22: f32 = trunc(v21);
    let v23: f32 = (v22 * 0.693145751953125f);
    let v24: f32 = ember_opaque_f32(v20 - v23);
    let v25: f32 = (v22 * 1.428606765330187e-06f);
    let v26: f32 = ember_opaque_f32(v24 - v25);
    let v27: f32 = (v26 * 1.4426950216293335f);
    let v28: bool = ember_eq_f32(v27, v27);
    let v29: bool = (!v28);
    let v30: bool = ember_lt_f32(v27, -152.0f);
    let v31: bool = ember_lt_f32(128.0f, v27);
    let v32: f32 = select(v27, 128.0f, v31);
    let v33: f32 = select(v32, -152.0f, v30);
    let v34: bool = ember_lt_f32(v33, 0.0f);
    let v35: f32 = select(0.5f, -0.5f, v34);
    let v36: f32 = ember_opaque_f32(v33 + v35);
    let v37: f32 = trunc(v36);
    let v38: f32 = ember_opaque_f32(v33 - v37);
    let v39: f32 = (1.5252733646775596e-05f * v38);
    let v40: f32 = ember_opaque_f32(v39 + 0.0001540352968731895f);
    let v41: f32 = (v40 * v38);
    let v42: f32 = ember_opaque_f32(v41 + 0.0013333557872101665f);
    let v43: f32 = (v42 * v38);
    let v44: f32 = ember_opaque_f32(v43 + 0.009618128649890423f);
    let v45: f32 = (v44 * v38);
    let v46: f32 = ember_opaque_f32(v45 + 0.05550410971045494f);
    let v47: f32 = (v46 * v38);
    let v48: f32 = ember_opaque_f32(v47 + 0.24022650718688965f);
    let v49: f32 = (v48 * v38);
    let v50: f32 = ember_opaque_f32(v49 + 0.6931471824645996f);
    let v51: f32 = (v50 * v38);
    let v52: f32 = ember_opaque_f32(v51 + 1.0f);
    let v53: i32 = i32(v37);
    let v54: i32 = (v53 >> 1u);
    let v55: i32 = (v54 + 127i);
    let v56: i32 = (v55 << 23u);
    let v57: f32 = bitcast<f32>(bitcast<u32>(v56));
    let v58: f32 = (v52 * v57);
    let v59: i32 = (v53 - v54);
    let v60: i32 = (v59 + 127i);
    let v61: i32 = (v60 << 23u);
    let v62: f32 = bitcast<f32>(bitcast<u32>(v61));
    let v63: f32 = (v58 * v62);
    let v64: f32 = select(v63, v27, v29);
    let v65: bool = ember_eq_f32(v22, v22);
    let v66: bool = (!v65);
    let v67: bool = ember_lt_f32(v22, -152.0f);
    let v68: bool = ember_lt_f32(128.0f, v22);
    let v69: f32 = select(v22, 128.0f, v68);
    let v70: f32 = select(v69, -152.0f, v67);
    let v71: bool = ember_lt_f32(v70, 0.0f);
    let v72: f32 = select(0.5f, -0.5f, v71);
    let v73: f32 = ember_opaque_f32(v70 + v72);
    let v74: f32 = trunc(v73);
    let v75: f32 = ember_opaque_f32(v70 - v74);
    let v76: f32 = (1.5252733646775596e-05f * v75);
    let v77: f32 = ember_opaque_f32(v76 + 0.0001540352968731895f);
    let v78: f32 = (v77 * v75);
    let v79: f32 = ember_opaque_f32(v78 + 0.0013333557872101665f);
    let v80: f32 = (v79 * v75);
    let v81: f32 = ember_opaque_f32(v80 + 0.009618128649890423f);
    let v82: f32 = (v81 * v75);
    let v83: f32 = ember_opaque_f32(v82 + 0.05550410971045494f);
    let v84: f32 = (v83 * v75);
    let v85: f32 = ember_opaque_f32(v84 + 0.24022650718688965f);
    let v86: f32 = (v85 * v75);
    let v87: f32 = ember_opaque_f32(v86 + 0.6931471824645996f);
    let v88: f32 = (v87 * v75);
    let v89: f32 = ember_opaque_f32(v88 + 1.0f);
    let v90: i32 = i32(v74);
    let v91: i32 = (v90 >> 1u);
    let v92: i32 = (v91 + 127i);
    let v93: i32 = (v92 << 23u);
    let v94: f32 = bitcast<f32>(bitcast<u32>(v93));
    let v95: f32 = (v89 * v94);
    let v96: i32 = (v90 - v91);
    let v97: i32 = (v96 + 127i);
    let v98: i32 = (v97 << 23u);
    let v99: f32 = bitcast<f32>(bitcast<u32>(v98));
    let v100: f32 = (v95 * v99);
    let v101: f32 = select(v100, v22, v66);
    let v102: f32 = (v64 * v101);
    let v103: f32 = select(v102, 0.0f, v19);
    let v104: f32 = select(0.0f, v103, v14);
    acc11 = (acc11 + v104);
  }
  ember_shared105[ember_lid] = acc11;
  workgroupBarrier();
  for (var stride105: i32 = 128i; stride105 > 0i; stride105 = stride105 >> 1u) {
    if (ember_lid < stride105) { ember_shared105[ember_lid] = (ember_shared105[ember_lid] + ember_shared105[ember_lid + stride105]); }
    workgroupBarrier();
  }
  let g106: f32 = ember_shared105[0];
  for (var loop1: i32 = 0i; loop1 < 2i; loop1++) {
    let v107: i32 = (loop1 * 256i);
    let v108: i32 = (v107 + ember_lid);
    let v109: bool = (v108 < 300i);
    let v110: i32 = select(299i, v108, v109);
    let v111: i32 = (v110 + v0);
    let v112: f32 = data1[v111];
    let v113: f32 = ember_opaque_f32(v112 - g10);
    let v114: bool = ember_lt_f32(v113, -105.0f);
    let v115: f32 = select(v113, 0.0f, v114);
    let v116: f32 = (v115 * 1.4426950216293335f);
    let v117: f32 = trunc(v116);
    let v118: f32 = (v117 * 0.693145751953125f);
    let v119: f32 = ember_opaque_f32(v115 - v118);
    let v120: f32 = (v117 * 1.428606765330187e-06f);
    let v121: f32 = ember_opaque_f32(v119 - v120);
    let v122: f32 = (v121 * 1.4426950216293335f);
    let v123: bool = ember_eq_f32(v122, v122);
    let v124: bool = (!v123);
    let v125: bool = ember_lt_f32(v122, -152.0f);
    let v126: bool = ember_lt_f32(128.0f, v122);
    let v127: f32 = select(v122, 128.0f, v126);
    let v128: f32 = select(v127, -152.0f, v125);
    let v129: bool = ember_lt_f32(v128, 0.0f);
    let v130: f32 = select(0.5f, -0.5f, v129);
    let v131: f32 = ember_opaque_f32(v128 + v130);
    let v132: f32 = trunc(v131);
    let v133: f32 = ember_opaque_f32(v128 - v132);
    let v134: f32 = (1.5252733646775596e-05f * v133);
    let v135: f32 = ember_opaque_f32(v134 + 0.0001540352968731895f);
    let v136: f32 = (v135 * v133);
    let v137: f32 = ember_opaque_f32(v136 + 0.0013333557872101665f);
    let v138: f32 = (v137 * v133);
    let v139: f32 = ember_opaque_f32(v138 + 0.009618128649890423f);
    let v140: f32 = (v139 * v133);
    let v141: f32 = ember_opaque_f32(v140 + 0.05550410971045494f);
    let v142: f32 = (v141 * v133);
    let v143: f32 = ember_opaque_f32(v142 + 0.24022650718688965f);
    let v144: f32 = (v143 * v133);
    let v145: f32 = ember_opaque_f32(v144 + 0.6931471824645996f);
    let v146: f32 = (v145 * v133);
    let v147: f32 = ember_opaque_f32(v146 + 1.0f);
    let v148: i32 = i32(v132);
    let v149: i32 = (v148 >> 1u);
    let v150: i32 = (v149 + 127i);
    let v151: i32 = (v150 << 23u);
    let v152: f32 = bitcast<f32>(bitcast<u32>(v151));
    let v153: f32 = (v147 * v152);
    let v154: i32 = (v148 - v149);
    let v155: i32 = (v154 + 127i);
    let v156: i32 = (v155 << 23u);
    let v157: f32 = bitcast<f32>(bitcast<u32>(v156));
    let v158: f32 = (v153 * v157);
    let v159: f32 = select(v158, v122, v124);
    let v160: bool = ember_eq_f32(v117, v117);
    let v161: bool = (!v160);
    let v162: bool = ember_lt_f32(v117, -152.0f);
    let v163: bool = ember_lt_f32(128.0f, v117);
    let v164: f32 = select(v117, 128.0f, v163);
    let v165: f32 = select(v164, -152.0f, v162);
    let v166: bool = ember_lt_f32(v165, 0.0f);
    let v167: f32 = select(0.5f, -0.5f, v166);
    let v168: f32 = ember_opaque_f32(v165 + v167);
    let v169: f32 = trunc(v168);
    let v170: f32 = ember_opaque_f32(v165 - v169);
    let v171: f32 = (1.5252733646775596e-05f * v170);
    let v172: f32 = ember_opaque_f32(v171 + 0.0001540352968731895f);
    let v173: f32 = (v172 * v170);
    let v174: f32 = ember_opaque_f32(v173 + 0.0013333557872101665f);
    let v175: f32 = (v174 * v170);
    let v176: f32 = ember_opaque_f32(v175 + 0.009618128649890423f);
    let v177: f32 = (v176 * v170);
    let v178: f32 = ember_opaque_f32(v177 + 0.05550410971045494f);
    let v179: f32 = (v178 * v170);
    let v180: f32 = ember_opaque_f32(v179 + 0.24022650718688965f);
    let v181: f32 = (v180 * v170);
    let v182: f32 = ember_opaque_f32(v181 + 0.6931471824645996f);
    let v183: f32 = (v182 * v170);
    let v184: f32 = ember_opaque_f32(v183 + 1.0f);
    let v185: i32 = i32(v169);
    let v186: i32 = (v185 >> 1u);
    let v187: i32 = (v186 + 127i);
    let v188: i32 = (v187 << 23u);
    let v189: f32 = bitcast<f32>(bitcast<u32>(v188));
    let v190: f32 = (v184 * v189);
    let v191: i32 = (v185 - v186);
    let v192: i32 = (v191 + 127i);
    let v193: i32 = (v192 << 23u);
    let v194: f32 = bitcast<f32>(bitcast<u32>(v193));
    let v195: f32 = (v190 * v194);
    let v196: f32 = select(v195, v117, v161);
    let v197: f32 = (v159 * v196);
    let v198: f32 = select(v197, 0.0f, v114);
    let v199: f32 = (v198 / g106);
    data0[v111] = v199;
  }
}
