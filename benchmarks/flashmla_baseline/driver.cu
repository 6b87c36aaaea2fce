// Standalone benchmark driver for FlashMLA's SM90 dense bf16 decode kernel
// (csrc/kernels/{splitkv_mla,mla_combine,get_mla_metadata}.cu, the 2025 "v2" kernel).
// No torch / Python. Params are filled exactly as FlashMLA's csrc/flash_api.cpp does
// (commit 287061ec34470c700294f705c0390804bee2cb7e), specialised to h_k = 1 (MQA),
// head dim 576 (K) / 512 (V), page size 64, bf16.
//
// Usage: flashmla_bench [--repeats N] [--only name,name] [--check] [--json PATH]

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cutlass/numeric_types.h>

#include "params.h"
#include "config.h"
#include "get_mla_metadata.h"
#include "mla_combine.h"
#include "splitkv_mla.h"

#define CK(call)                                                                               \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "FATAL CUDA error %s (%d) at %s:%d: %s\n", cudaGetErrorName(e_),   \
                    (int)e_, __FILE__, __LINE__, #call);                                       \
            fprintf(stderr, "  %s\n", cudaGetErrorString(e_));                                 \
            exit(2);                                                                           \
        }                                                                                      \
    } while (0)

static void die(const char* msg) {
    fprintf(stderr, "FATAL: %s\n", msg);
    exit(3);
}

static constexpr int D_K = 576;
static constexpr int D_V = 512;
static constexpr int PAGE = 64;
static_assert(Config::HEAD_DIM_K == D_K && Config::HEAD_DIM_V == D_V && Config::PAGE_BLOCK_SIZE == PAGE, "config");

// -------------------------------------------------------------------------------------------
// Device-side random init (hash based, deterministic): bf16 ~ N(0,1)
// -------------------------------------------------------------------------------------------
__host__ __device__ inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__global__ void init_normal_bf16(__nv_bfloat16* p, size_t n, uint64_t seed) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint64_t h = splitmix64(seed * 0x100000001B3ull ^ i);
        float u1 = ((h >> 40) + 1) * (1.0f / 16777217.0f);          // (0,1]
        float u2 = ((h & 0xFFFFFFull)) * (1.0f / 16777216.0f);      // [0,1)
        float r = sqrtf(-2.0f * logf(u1));
        p[i] = __float2bfloat16(r * cospif(2.0f * u2));
    }
}

__global__ void fill_f32(float* p, size_t n, float v) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) p[i] = v;
}

__global__ void fill_bf16(__nv_bfloat16* p, size_t n, float v) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    __nv_bfloat16 b = __float2bfloat16(v);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) p[i] = b;
}

static void dev_randn(__nv_bfloat16* p, size_t n, uint64_t seed, cudaStream_t s) {
    init_normal_bf16<<<1024, 256, 0, s>>>(p, n, seed);
    CK(cudaGetLastError());
}
static void dev_fill_f32(float* p, size_t n, float v, cudaStream_t s) {
    fill_f32<<<1024, 256, 0, s>>>(p, n, v);
    CK(cudaGetLastError());
}
static void dev_fill_bf16(__nv_bfloat16* p, size_t n, float v, cudaStream_t s) {
    fill_bf16<<<1024, 256, 0, s>>>(p, n, v);
    CK(cudaGetLastError());
}

static inline float bf2f(__nv_bfloat16 x) { return __bfloat162float(x); }
static inline int cdiv(int a, int b) { return (a + b - 1) / b; }

// -------------------------------------------------------------------------------------------
// One problem instance on the device (possibly several page sets / q sets)
// -------------------------------------------------------------------------------------------
struct Problem {
    int b = 0, s_q = 0, h_q = 0;
    bool causal = false;
    std::vector<int> lens;
    int num_sets = 1;
    int pages_per_set = 0;   // sum_i ceil(len_i / 64)
    int max_pages = 0;       // max_i ceil(len_i / 64)
    int num_sm_parts = 0;
    int R = 0;               // q_seq_per_hk = s_q * h_q (h_k = 1)

    __nv_bfloat16* d_kv = nullptr;     // [num_sets*pages_per_set, 64, 1, 576]
    __nv_bfloat16* d_q = nullptr;      // [num_sets][b, s_q, h_q, 576]
    __nv_bfloat16* d_o = nullptr;      // [b, R, 1, 512]  (shared by all calls)
    float* d_lse = nullptr;            // [b, 1, R]       (shared by all calls)
    float* d_lse_accum = nullptr;      // [b+num_sm_parts, 1, R]
    float* d_o_accum = nullptr;        // [b+num_sm_parts, 1, R, 512]
    int* d_seqlens = nullptr;          // [b]
    int* d_sched = nullptr;            // [num_sm_parts, 8]
    int* d_num_splits = nullptr;       // [b+1]
    int* d_block_tables = nullptr;     // [num_tables][b, max_pages]
    int num_tables = 0;
    std::vector<int> h_block_tables;   // host copy

    size_t q_elems() const { return (size_t)b * s_q * h_q * D_K; }
    size_t o_elems() const { return (size_t)b * R * D_V; }
    size_t kv_elems() const { return (size_t)num_sets * pages_per_set * PAGE * D_K; }
    int total_pages() const { return num_sets * pages_per_set; }
};

static int g_sm_count = 0;

static void problem_setup(Problem& P, int b, int s_q, int h_q, const std::vector<int>& lens, bool causal,
                          int num_sets, int num_tables, uint64_t seed, cudaStream_t st) {
    P.b = b; P.s_q = s_q; P.h_q = h_q; P.causal = causal; P.lens = lens;
    P.num_sets = num_sets; P.num_tables = num_tables;
    P.R = s_q * h_q;
    P.pages_per_set = 0; P.max_pages = 0;
    for (int l : lens) { int np = cdiv(l, PAGE); P.pages_per_set += np; P.max_pages = std::max(P.max_pages, np); }
    // flash_api.cpp get_mla_metadata(): num_sm_parts = sm_count / num_heads_k / ceil_div(num_heads_per_head_k, BLOCK_SIZE_M)
    // with num_heads_per_head_k = s_q * h_q // h_kv (as in FlashMLA's tests), num_heads_k = 1.
    P.num_sm_parts = g_sm_count / 1 / cdiv(s_q * h_q, Config::BLOCK_SIZE_M);
    if (P.num_sm_parts < 1) die("num_sm_parts < 1");

    CK(cudaMalloc(&P.d_kv, P.kv_elems() * sizeof(__nv_bfloat16)));
    CK(cudaMalloc(&P.d_q, (size_t)num_sets * P.q_elems() * sizeof(__nv_bfloat16)));
    CK(cudaMalloc(&P.d_o, P.o_elems() * sizeof(__nv_bfloat16)));
    CK(cudaMalloc(&P.d_lse, (size_t)b * P.R * sizeof(float)));
    size_t total_splits = (size_t)b + P.num_sm_parts;
    CK(cudaMalloc(&P.d_lse_accum, total_splits * P.R * sizeof(float)));
    CK(cudaMalloc(&P.d_o_accum, total_splits * P.R * D_V * sizeof(float)));
    CK(cudaMalloc(&P.d_seqlens, b * sizeof(int)));
    CK(cudaMalloc(&P.d_sched, (size_t)P.num_sm_parts * TileSchedulerMetaDataSize * sizeof(int)));
    CK(cudaMalloc(&P.d_num_splits, (b + 1) * sizeof(int)));
    CK(cudaMalloc(&P.d_block_tables, (size_t)num_tables * b * P.max_pages * sizeof(int)));

    CK(cudaMemcpyAsync(P.d_seqlens, lens.data(), b * sizeof(int), cudaMemcpyHostToDevice, st));
    dev_randn(P.d_kv, P.kv_elems(), seed * 7 + 1, st);
    dev_randn(P.d_q, (size_t)num_sets * P.q_elems(), seed * 7 + 2, st);

    // Block tables: table t uses page set (t % num_sets), through its own random permutation of that set's pages.
    std::mt19937_64 rng(seed * 1000003ull + 17);
    P.h_block_tables.assign((size_t)num_tables * b * P.max_pages, 0);
    std::vector<int> perm(P.pages_per_set);
    for (int t = 0; t < num_tables; ++t) {
        int set = t % num_sets;
        int base = set * P.pages_per_set;
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        int off = 0;
        int* tab = P.h_block_tables.data() + (size_t)t * b * P.max_pages;
        for (int i = 0; i < b; ++i) {
            int np = cdiv(lens[i], PAGE);
            for (int j = 0; j < P.max_pages; ++j)
                tab[(size_t)i * P.max_pages + j] = base + (j < np ? perm[off + j] : perm[0]);
            off += np;
        }
    }
    CK(cudaMemcpyAsync(P.d_block_tables, P.h_block_tables.data(), P.h_block_tables.size() * sizeof(int),
                       cudaMemcpyHostToDevice, st));
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
}

static void problem_free(Problem& P) {
    cudaFree(P.d_kv); cudaFree(P.d_q); cudaFree(P.d_o); cudaFree(P.d_lse); cudaFree(P.d_lse_accum);
    cudaFree(P.d_o_accum); cudaFree(P.d_seqlens); cudaFree(P.d_sched); cudaFree(P.d_num_splits);
    cudaFree(P.d_block_tables);
    CK(cudaGetLastError());
    P = Problem();
}

// Fill O, LSE and the split-KV accumulation buffers with NaN (so unwritten outputs are detected)
static void poison_outputs(Problem& P, cudaStream_t st) {
    size_t total_splits = (size_t)P.b + P.num_sm_parts;
    dev_fill_bf16(P.d_o, P.o_elems(), NAN, st);
    dev_fill_f32(P.d_lse, (size_t)P.b * P.R, NAN, st);
    dev_fill_f32(P.d_lse_accum, total_splits * P.R, NAN, st);
    dev_fill_f32(P.d_o_accum, total_splits * P.R * D_V, NAN, st);
}

// get_mla_metadata() of flash_api.cpp
static void launch_metadata(Problem& P, cudaStream_t st) {
    Mla_metadata_params mp = {};
    mp.seqlens_k_ptr = P.d_seqlens;
    mp.tile_scheduler_metadata_ptr = P.d_sched;
    mp.num_splits_ptr = P.d_num_splits;
    mp.batch_size = P.b;
    mp.block_size_n = Config::PAGE_BLOCK_SIZE;
    mp.fixed_overhead_num_blocks = Config::FIXED_OVERHEAD_NUM_BLOCKS;
    mp.num_sm_parts = P.num_sm_parts;
    run_get_mla_metadata_kernel(mp, st);
}

// mha_fwd_kvcache_mla() of flash_api.cpp, for call using block table `table` (and q set table % num_sets)
static void launch_decode(Problem& P, int table, float softmax_scale, cudaStream_t st) {
    const int set = table % P.num_sets;
    Flash_fwd_mla_params p = {};
    p.b = P.b;
    p.s_q = P.s_q;
    p.q_seq_per_hk = P.R;                 // seqlen_q_ori * num_q_heads_per_hk
    p.seqlens_k_ptr = P.d_seqlens;
    p.h_q = P.h_q;
    p.h_k = 1;
    p.num_blocks = P.total_pages();
    p.q_head_per_hk = P.h_q;
    p.is_causal = (P.s_q == 1) ? false : P.causal;   // "if (seqlen_q_ori == 1) { is_causal = false; }"
    p.d = D_K;
    p.d_v = D_V;
    p.scale_softmax = softmax_scale;
    p.scale_softmax_log2 = float(softmax_scale * M_LOG2E);
    p.descale_q = 1.0f;  // unused by the bf16 kernel
    p.descale_k = 1.0f;
    p.q_ptr = P.d_q + (size_t)set * P.q_elems();
    p.k_ptr = P.d_kv;
    p.o_ptr = P.d_o;
    p.softmax_lse_ptr = P.d_lse;
    // Strides in elements. q viewed as (b, q_seq_per_hk, h_k=1, 576), contiguous.
    p.q_batch_stride = (int64_t)P.R * D_K;
    p.k_batch_stride = (int64_t)PAGE * 1 * D_K;   // kcache (num_blocks, 64, 1, 576)
    p.o_batch_stride = (int64_t)P.R * D_V;
    p.q_row_stride = D_K;
    p.k_row_stride = D_K;
    p.o_row_stride = D_V;
    p.q_head_stride = D_K;
    p.k_head_stride = D_K;
    p.o_head_stride = D_V;
    p.block_table = P.d_block_tables + (size_t)table * P.b * P.max_pages;
    p.block_table_batch_stride = P.max_pages;
    p.page_block_size = PAGE;
    p.tile_scheduler_metadata_ptr = P.d_sched;
    p.num_sm_parts = P.num_sm_parts;
    p.num_splits_ptr = P.d_num_splits;
    p.total_num_splits = P.b + P.num_sm_parts;
    p.softmax_lseaccum_ptr = P.d_lse_accum;
    p.oaccum_ptr = P.d_o_accum;
    run_flash_splitkv_mla_kernel<cutlass::bfloat16_t>(p, st);
    run_flash_mla_combine_kernel<cutlass::bfloat16_t>(p, st);
}

// -------------------------------------------------------------------------------------------
// CPU double-precision reference
// -------------------------------------------------------------------------------------------
struct RefStats {
    double o_err2 = 0, o_ref2 = 0, lse_max_err = 0;
    long rows = 0, empty_rows = 0, empty_bad = 0, nonfinite = 0;
};

// q_row: 576 floats; kv rows fetched via callback; outputs o_ref[512], returns lse (natural log)
static void ref_row(const float* q, int n_visible, const std::vector<const float*>& krows, double scale,
                    double* o_ref, double* lse_ref) {
    std::vector<double> s(n_visible);
    double mx = -INFINITY;
    for (int t = 0; t < n_visible; ++t) {
        const float* k = krows[t];
        double acc = 0;
        for (int d = 0; d < D_K; ++d) acc += (double)q[d] * (double)k[d];
        s[t] = acc * scale;
        mx = std::max(mx, s[t]);
    }
    double sum = 0;
    for (int t = 0; t < n_visible; ++t) { s[t] = std::exp(s[t] - mx); sum += s[t]; }
    for (int d = 0; d < D_V; ++d) o_ref[d] = 0;
    for (int t = 0; t < n_visible; ++t) {
        const float* v = krows[t];
        double w = s[t] / sum;
        for (int d = 0; d < D_V; ++d) o_ref[d] += w * (double)v[d];
    }
    *lse_ref = mx + std::log(sum);
}

// Verify rows (request bi, all s, heads in `heads`) of the last launch_decode(table) against the CPU reference.
static void verify_rows(Problem& P, int table, double scale, const std::vector<int>& reqs, const std::vector<int>& heads,
                        RefStats& st, cudaStream_t stream) {
    const int set = table % P.num_sets;
    std::vector<__nv_bfloat16> o_h(P.o_elems());
    std::vector<float> lse_h((size_t)P.b * P.R);
    CK(cudaMemcpyAsync(o_h.data(), P.d_o, o_h.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost, stream));
    CK(cudaMemcpyAsync(lse_h.data(), P.d_lse, lse_h.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    const int* tab = P.h_block_tables.data() + (size_t)table * P.b * P.max_pages;
    for (int bi : reqs) {
        int len = P.lens[bi];
        int np = cdiv(len, PAGE);
        // fetch this request's KV pages (through the block table) and q rows
        std::vector<__nv_bfloat16> kv_b((size_t)np * PAGE * D_K);
        for (int j = 0; j < np; ++j)
            CK(cudaMemcpyAsync(kv_b.data() + (size_t)j * PAGE * D_K, P.d_kv + (size_t)tab[(size_t)bi * P.max_pages + j] * PAGE * D_K,
                               (size_t)PAGE * D_K * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost, stream));
        std::vector<__nv_bfloat16> q_b((size_t)P.R * D_K);
        CK(cudaMemcpyAsync(q_b.data(), P.d_q + (size_t)set * P.q_elems() + (size_t)bi * P.R * D_K,
                           q_b.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost, stream));
        CK(cudaStreamSynchronize(stream));
        std::vector<float> kv_f(kv_b.size()), q_f(q_b.size());
        for (size_t i = 0; i < kv_b.size(); ++i) kv_f[i] = bf2f(kv_b[i]);
        for (size_t i = 0; i < q_b.size(); ++i) q_f[i] = bf2f(q_b[i]);
        std::vector<const float*> krows(len);
        for (int t = 0; t < len; ++t) krows[t] = kv_f.data() + (size_t)t * D_K;   // token t = page t/64, row t%64 (pages gathered in order)
        std::vector<double> o_ref(D_V);
        for (int s = 0; s < P.s_q; ++s) {
            int n_vis = (P.causal && P.s_q > 1) ? (len - P.s_q + s + 1) : len;
            for (int h : heads) {
                int r = s * P.h_q + h;   // row in the (b, s_q*h_q) folded layout
                const __nv_bfloat16* o = o_h.data() + ((size_t)bi * P.R + r) * D_V;
                float lse = lse_h[(size_t)bi * P.R + r];
                bool finite = true;
                for (int d = 0; d < D_V; ++d) if (!std::isfinite(bf2f(o[d]))) finite = false;
                if (n_vis <= 0) {
                    // No visible key (only possible when seq_len < s_q with causal). FlashMLA writes O = 0, LSE = +inf.
                    ++st.empty_rows;
                    bool zero = finite;
                    for (int d = 0; d < D_V; ++d) if (bf2f(o[d]) != 0.f) zero = false;
                    if (!zero) ++st.empty_bad;
                    continue;
                }
                if (!finite || !std::isfinite(lse)) ++st.nonfinite;
                double lse_ref;
                ref_row(q_f.data() + (size_t)r * D_K, n_vis, krows, scale, o_ref.data(), &lse_ref);
                for (int d = 0; d < D_V; ++d) {
                    double diff = (double)bf2f(o[d]) - o_ref[d];
                    st.o_err2 += diff * diff;
                    st.o_ref2 += o_ref[d] * o_ref[d];
                }
                double le = std::fabs((double)lse - lse_ref);
                if (!(le == le)) le = INFINITY;
                st.lse_max_err = std::max(st.lse_max_err, le);
                ++st.rows;
            }
        }
    }
}

static bool report_check(const char* name, const RefStats& st) {
    double rel = st.o_ref2 > 0 ? std::sqrt(st.o_err2 / st.o_ref2) : (st.o_err2 > 0 ? INFINITY : 0.0);
    if (!(rel == rel)) rel = INFINITY;
    bool pass = rel <= 1e-2 && st.lse_max_err <= 1e-2 && st.nonfinite == 0 && st.empty_bad == 0 && st.rows > 0;
    printf("  check %-28s rows=%ld  O rel L2 err=%.3e  max |LSE err|=%.3e  nonfinite=%ld",
           name, st.rows, rel, st.lse_max_err, st.nonfinite);
    if (st.empty_rows) printf("  no-visible-key rows=%ld (expect O=0; bad=%ld)", st.empty_rows, st.empty_bad);
    printf("  -> %s\n", pass ? "CHECK PASS" : "CHECK FAIL");
    fflush(stdout);
    return pass;
}

static bool run_check_case(const char* name, int b, int s_q, int h_q, std::vector<int> lens, bool causal, cudaStream_t st) {
    Problem P;
    problem_setup(P, b, s_q, h_q, lens, causal, /*num_sets=*/1, /*num_tables=*/1, /*seed=*/1234 + b * 31 + h_q, st);
    const double scale = 1.0 / std::sqrt((double)D_K);
    poison_outputs(P, st);
    launch_metadata(P, st);
    launch_decode(P, 0, (float)scale, st);
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    std::vector<int> reqs(b), heads(h_q);
    std::iota(reqs.begin(), reqs.end(), 0);
    std::iota(heads.begin(), heads.end(), 0);
    RefStats rs;
    verify_rows(P, 0, scale, reqs, heads, rs, st);
    bool ok = report_check(name, rs);
    problem_free(P);
    return ok;
}

// -------------------------------------------------------------------------------------------
// Benchmark configs
// -------------------------------------------------------------------------------------------
static const int kVariedLens[128] = {
    3719,4162,5527,3898,6990,957,4650,1627,3987,3501,3496,1,4269,5380,7535,5804,1,1586,6025,1928,4511,1035,5699,6499,
    4650,4645,4470,2754,5250,4005,4330,5091,7479,7855,3584,5219,4867,7047,733,2370,5646,5330,1,346,7188,4747,5300,4534,
    2422,1176,2204,1318,3454,4109,2449,9128,5941,1923,3850,3927,4590,3065,5679,4311,5374,1876,3366,5336,5333,3234,3331,
    4872,7150,3592,5314,4693,3836,1550,3993,4068,3486,4606,3022,3274,6500,8246,3700,2649,1407,4907,5906,5535,7026,5993,
    8027,3126,1609,1313,5256,4537,2874,4337,3994,4183,3589,3763,6825,3041,5318,1472,4809,5031,1243,4217,3999,5187,327,
    3719,3569,1872,6103,2546,3151,3063,6725,6258,4085,4844};
// = [max(int(rng.normalvariate(4096, 2048)), 1) for _ in range(128)] with rng = random.Random(0)
// (sum 526961, min 1, max 9128; generated once with python3 and embedded)

struct BenchConfig {
    const char* name;
    int b, s_q, h_q, seq_len;  // seq_len < 0 => varied lengths
    bool causal;
    double facts_us;           // reference (H200) time from the facts file
};

static const BenchConfig kConfigs[] = {
    {"b128_sq1_h128_4k",        128, 1, 128, 4096,  false, 250.5},
    {"b128_sq2_h128_4k_causal", 128, 2, 128, 4096,  true,  477.3},
    {"b64_sq1_h16_8k",          64,  1, 16,  8192,  false, 172.0},
    {"b32_sq1_h64_4k",          32,  1, 64,  4096,  false, 59.5},
    {"b1_sq1_h128_32k",         1,   1, 128, 32768, false, 50.4},
    {"b16_sq1_h128_1k",         16,  1, 128, 1024,  false, 27.4},
    {"b128_sq1_h128_varied",    128, 1, 128, -1,    false, 269.7},
};

struct Result {
    std::string name;
    int b, s_q, h_q; bool causal; long sum_len; int num_sets, calls, num_sm_parts, repeats;
    double us_meta, us_nometa, us_meta_min, us_nometa_min, facts_us;
    double gbps_meta, gbps_nometa, tflops_meta, tflops_nometa;
    long nan_o, nan_lse;
    int check;   // -1 not run, 0 fail, 1 pass
};

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void time_graph(cudaGraphExec_t ge, cudaStream_t st, int repeats, int calls, double& med_us, double& min_us) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int w = 0; w < 2; ++w) CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    std::vector<double> per_call;
    for (int r = 0; r < repeats; ++r) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        per_call.push_back(ms * 1000.0 / calls);
    }
    CK(cudaGetLastError());
    med_us = median(per_call);
    min_us = *std::min_element(per_call.begin(), per_call.end());
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
}

static cudaGraphExec_t capture(Problem& P, bool with_meta, int calls, float scale, cudaStream_t st) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
    if (with_meta) launch_metadata(P, st);
    for (int i = 0; i < calls; ++i) launch_decode(P, i, scale, st);
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphDestroy(g));
    CK(cudaGraphUpload(ge, st));
    CK(cudaStreamSynchronize(st));
    return ge;
}

static Result run_config(const BenchConfig& c, int repeats, bool do_check, cudaStream_t st) {
    Result res{};
    res.name = c.name; res.b = c.b; res.s_q = c.s_q; res.h_q = c.h_q; res.causal = c.causal;
    res.facts_us = c.facts_us; res.repeats = repeats; res.check = -1;
    std::vector<int> lens(c.b);
    for (int i = 0; i < c.b; ++i) lens[i] = c.seq_len > 0 ? c.seq_len : kVariedLens[i];
    long sum_len = 0;
    for (int l : lens) sum_len += l;
    res.sum_len = sum_len;

    const double kv_bytes = (double)sum_len * D_K * 2;
    const double budget = 4.0 * 60.0 * 1024 * 1024;
    int num_sets = std::max(2, std::min(16, (int)std::ceil(budget / kv_bytes)));
    int calls = std::max(num_sets, std::min(64, (int)std::ceil(4000.0 / c.facts_us)));
    res.num_sets = num_sets; res.calls = calls;

    printf("[%s] setup: b=%d s_q=%d h_q=%d causal=%d sum_len=%ld kv=%.1f MB x %d sets, %d calls/step\n",
           c.name, c.b, c.s_q, c.h_q, (int)c.causal, sum_len, kv_bytes / 1e6, num_sets, calls);
    fflush(stdout);
    Problem P;
    problem_setup(P, c.b, c.s_q, c.h_q, lens, c.causal, num_sets, calls, /*seed=*/0xF1A5u + (uint64_t)c.b * 131 + c.h_q * 7 + c.s_q,
                  st);
    res.num_sm_parts = P.num_sm_parts;
    const float scale = (float)(1.0 / std::sqrt((double)D_K));

    // metadata computed once (used by the "without metadata" graph; the "with" graph recomputes it in-step)
    poison_outputs(P, st);
    launch_metadata(P, st);
    launch_decode(P, 0, scale, st);   // eager run (also loads modules before capture)
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());

    if (do_check) {
        std::vector<int> reqs = {0, c.b / 2, c.b - 1};
        reqs.erase(std::unique(reqs.begin(), reqs.end()), reqs.end());
        std::vector<int> heads;
        for (int h = 0; h < c.h_q; h += std::max(1, c.h_q / 8)) heads.push_back(h);
        if (heads.back() != c.h_q - 1) heads.push_back(c.h_q - 1);
        RefStats rs;
        verify_rows(P, 0, 1.0 / std::sqrt((double)D_K), reqs, heads, rs, st);
        res.check = report_check((std::string(c.name) + " (sampled)").c_str(), rs) ? 1 : 0;
    }

    printf("[%s] capturing graphs (num_sm_parts=%d)\n", c.name, P.num_sm_parts);
    fflush(stdout);
    cudaGraphExec_t g_meta = capture(P, true, calls, scale, st);
    cudaGraphExec_t g_nometa = capture(P, false, calls, scale, st);

    printf("[%s] timing %d replays x %d calls (with metadata)\n", c.name, repeats, calls);
    fflush(stdout);
    time_graph(g_meta, st, repeats, calls, res.us_meta, res.us_meta_min);
    printf("[%s] timing %d replays x %d calls (without metadata)\n", c.name, repeats, calls);
    fflush(stdout);
    time_graph(g_nometa, st, repeats, calls, res.us_nometa, res.us_nometa_min);

    // smoke check: outputs of the last replay must be finite everywhere
    {
        std::vector<__nv_bfloat16> o_h(P.o_elems());
        std::vector<float> lse_h((size_t)P.b * P.R);
        CK(cudaMemcpy(o_h.data(), P.d_o, o_h.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lse_h.data(), P.d_lse, lse_h.size() * sizeof(float), cudaMemcpyDeviceToHost));
        long no = 0, nl = 0;
        for (auto x : o_h) if (!std::isfinite(bf2f(x))) ++no;
        for (auto x : lse_h) if (!std::isfinite(x)) ++nl;
        res.nan_o = no; res.nan_lse = nl;
        if (no || nl) printf("[%s] WARNING: %ld non-finite O values, %ld non-finite LSE values after timing\n", c.name, no, nl);
    }

    CK(cudaGraphExecDestroy(g_meta));
    CK(cudaGraphExecDestroy(g_nometa));
    problem_free(P);

    const double bytes = 2.0 * ((double)sum_len * D_K + (double)c.b * c.s_q * c.h_q * (D_K + D_V));
    const double flops = 2.0 * c.s_q * (double)sum_len * c.h_q * (D_K + D_V);
    res.gbps_meta = bytes / (res.us_meta * 1e-6) / 1e9;
    res.gbps_nometa = bytes / (res.us_nometa * 1e-6) / 1e9;
    res.tflops_meta = flops / (res.us_meta * 1e-6) / 1e12;
    res.tflops_nometa = flops / (res.us_nometa * 1e-6) / 1e12;
    printf("[%s] done: %.2f us/call with metadata, %.2f us/call without (facts H200: %.1f us)\n", c.name, res.us_meta,
           res.us_nometa, c.facts_us);
    fflush(stdout);
    return res;
}

int main(int argc, char** argv) {
    int repeats = 9;
    bool do_check = false;
    std::string only, json_path;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto need = [&](const char* flag) -> std::string {
            if (i + 1 >= argc) { fprintf(stderr, "missing value for %s\n", flag); exit(1); }
            return argv[++i];
        };
        if (a == "--repeats") { repeats = atoi(need("--repeats").c_str()); if (repeats < 1) die("--repeats must be >= 1"); }
        else if (a == "--only") only = need("--only");
        else if (a == "--check") do_check = true;
        else if (a == "--json") json_path = need("--json");
        else if (a == "-h" || a == "--help") {
            printf("usage: %s [--repeats N] [--only name,name] [--check] [--json PATH]\nconfigs:", argv[0]);
            for (auto& c : kConfigs) printf(" %s", c.name);
            printf("\n");
            return 0;
        } else { fprintf(stderr, "unknown argument: %s\n", a.c_str()); return 1; }
    }
    std::vector<std::string> only_list;
    if (!only.empty()) {
        size_t pos = 0;
        while (pos <= only.size()) {
            size_t q = only.find(',', pos);
            if (q == std::string::npos) q = only.size();
            if (q > pos) only_list.push_back(only.substr(pos, q - pos));
            pos = q + 1;
        }
        for (auto& n : only_list) {
            bool found = false;
            for (auto& c : kConfigs) if (n == c.name) found = true;
            if (!found) { fprintf(stderr, "unknown config in --only: %s\n", n.c_str()); return 1; }
        }
    }

    int dev = 0;
    CK(cudaSetDevice(dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));
    int clock_khz = 0, mem_clock_khz = 0, bus_width = 0, drv = 0, rt = 0;
    CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
    CK(cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, dev));
    CK(cudaDeviceGetAttribute(&bus_width, cudaDevAttrGlobalMemoryBusWidth, dev));
    CK(cudaDriverGetVersion(&drv));
    CK(cudaRuntimeGetVersion(&rt));
    g_sm_count = prop.multiProcessorCount;
    printf("FlashMLA SM90 dense bf16 decode benchmark (FlashMLA csrc/kernels v2 kernel, standalone driver)\n");
    printf("GPU: %s | SMs: %d | cc %d.%d | SM clock (max): %d MHz | mem clock (max): %d MHz | bus: %d bit | "
           "L2: %.1f MB | mem: %.1f GB | driver %d | runtime %d\n",
           prop.name, prop.multiProcessorCount, prop.major, prop.minor, clock_khz / 1000, mem_clock_khz / 1000, bus_width,
           prop.l2CacheSize / 1048576.0, prop.totalGlobalMem / 1073741824.0, drv, rt);
    printf("settings: repeats=%d, softmax_scale=1/sqrt(576), page=64, h_kv=1, d=576, dv=512, bf16; "
           "output buffers (O, LSE, accum) shared by all calls of a step; q and KV rotate over page sets\n",
           repeats);
    fflush(stdout);
    if (prop.major != 9 || prop.minor != 0) {
        fprintf(stderr, "FATAL: this binary is built for sm_90a only (found cc %d.%d)\n", prop.major, prop.minor);
        return 4;
    }

    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

    bool all_ok = true;
    if (do_check) {
        printf("== correctness checks (CPU double reference; pass: O rel L2 <= 1e-2, |LSE err| <= 1e-2, LSE natural log) ==\n");
        fflush(stdout);
        all_ok &= run_check_case("b2_sq1_h16_{200,3}", 2, 1, 16, {200, 3}, false, st);
        all_ok &= run_check_case("b3_sq2_h64_causal_{130,1,64}", 3, 2, 64, {130, 1, 64}, true, st);
        all_ok &= run_check_case("b1_sq1_h128_{1000}", 1, 1, 128, {1000}, false, st);
    }

    std::vector<Result> results;
    for (auto& c : kConfigs) {
        if (!only_list.empty() && std::find(only_list.begin(), only_list.end(), std::string(c.name)) == only_list.end())
            continue;
        results.push_back(run_config(c, repeats, do_check, st));
        if (results.back().check == 0) all_ok = false;
        if (results.back().nan_o || results.back().nan_lse) all_ok = false;
    }

    printf("\n%-25s %4s %4s %4s %3s %5s %5s %5s | %12s %12s | %9s %9s | %8s %8s | %10s\n", "config", "b", "s_q", "h_q",
           "cau", "parts", "sets", "calls", "us/call(+md)", "us/call(-md)", "GB/s(+md)", "GB/s(-md)", "TF/s(+md)",
           "TF/s(-md)", "facts H200");
    for (auto& r : results) {
        printf("%-25s %4d %4d %4d %3d %5d %5d %5d | %12.2f %12.2f | %9.0f %9.0f | %8.1f %8.1f | %10.1f\n", r.name.c_str(),
               r.b, r.s_q, r.h_q, (int)r.causal, r.num_sm_parts, r.num_sets, r.calls, r.us_meta, r.us_nometa, r.gbps_meta,
               r.gbps_nometa, r.tflops_meta, r.tflops_nometa, r.facts_us);
    }
    printf("(+md: step = get_mla_metadata + calls x (splitkv + combine), per-call = replay time / calls, median of %d; "
           "-md: metadata computed once before capture)\n", repeats);
    fflush(stdout);

    if (!json_path.empty()) {
        FILE* f = fopen(json_path.c_str(), "w");
        if (!f) { fprintf(stderr, "FATAL: cannot open %s for writing\n", json_path.c_str()); return 5; }
        std::string gname = prop.name;
        for (auto& ch : gname) if (ch == '"' || ch == '\\') ch = ' ';
        fprintf(f, "{\n  \"kernel\": \"FlashMLA SM90 dense bf16 decode (csrc/kernels v2: splitkv_mla + mla_combine + get_mla_metadata)\",\n");
        fprintf(f, "  \"gpu\": \"%s\", \"sm_count\": %d, \"sm_clock_mhz\": %d, \"mem_clock_mhz\": %d, \"mem_bus_bits\": %d, "
                   "\"l2_bytes\": %d, \"driver_version\": %d, \"runtime_version\": %d,\n",
                gname.c_str(), prop.multiProcessorCount, clock_khz / 1000, mem_clock_khz / 1000, bus_width, prop.l2CacheSize, drv, rt);
        fprintf(f, "  \"repeats\": %d, \"softmax_scale\": %.9g, \"check_run\": %s, \"all_ok\": %s,\n", repeats,
                1.0 / std::sqrt(576.0), do_check ? "true" : "false", all_ok ? "true" : "false");
        fprintf(f, "  \"configs\": [\n");
        for (size_t i = 0; i < results.size(); ++i) {
            auto& r = results[i];
            fprintf(f,
                    "    {\"name\": \"%s\", \"b\": %d, \"s_q\": %d, \"h_q\": %d, \"causal\": %s, \"sum_seq_len\": %ld, "
                    "\"num_sm_parts\": %d, \"num_sets\": %d, \"calls_per_step\": %d, "
                    "\"us_per_call_with_metadata\": %.4f, \"us_per_call_without_metadata\": %.4f, "
                    "\"us_per_call_with_metadata_min\": %.4f, \"us_per_call_without_metadata_min\": %.4f, "
                    "\"gbps_with_metadata\": %.2f, \"gbps_without_metadata\": %.2f, "
                    "\"tflops_with_metadata\": %.3f, \"tflops_without_metadata\": %.3f, \"facts_h200_us\": %.1f, "
                    "\"nonfinite_o\": %ld, \"nonfinite_lse\": %ld, \"check\": %s}%s\n",
                    r.name.c_str(), r.b, r.s_q, r.h_q, r.causal ? "true" : "false", r.sum_len, r.num_sm_parts, r.num_sets,
                    r.calls, r.us_meta, r.us_nometa, r.us_meta_min, r.us_nometa_min, r.gbps_meta, r.gbps_nometa,
                    r.tflops_meta, r.tflops_nometa, r.facts_us, r.nan_o, r.nan_lse,
                    r.check < 0 ? "null" : (r.check ? "\"pass\"" : "\"fail\""), i + 1 < results.size() ? "," : "");
        }
        fprintf(f, "  ]\n}\n");
        fclose(f);
        printf("wrote %s\n", json_path.c_str());
    }

    CK(cudaStreamDestroy(st));
    if (do_check) printf("%s\n", all_ok ? "ALL CHECKS PASS" : "SOME CHECKS FAILED");
    return all_ok ? 0 : 6;
}
