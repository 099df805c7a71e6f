// PDSERVE_CLONES: compile a function for x86-64-v3 (AVX2 + FMA) and for baseline x86-64; the
// loader picks the variant the CPU runs (GCC function multi-versioning), so one build serves any
// x86-64 host. Helpers marked always_inline inline into each variant. (A list "avx2,fma" would make
// two clones, AVX2 without FMA and FMA without AVX2.)
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PDSERVE_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PDSERVE_CLONES
#endif
