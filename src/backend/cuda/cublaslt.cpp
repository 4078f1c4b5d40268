// cublaslt.h: the library loaded with dlopen, one handle per process, and a plan (descriptors +
// the heuristic's first algorithm) cached per problem shape with the token count n rounded up to a
// power of two, so a call after the first is a few host-side lookups and one cublasLtMatmul.
//
// Why n is bucketed: a server sees a new token count at nearly every prefill step. Asking the
// heuristic costs ~0.2 ms per shape, and each kernel it picks is loaded into the context on its
// first launch (~2.5-5 ms per kernel, measured on the H200): per exact n, every new prompt length
// paid both for each of a forward's ~10 GEMM shapes. The algorithm chosen for the bucket runs any
// n up to it; should cuBLASLt refuse one for a particular n, that n gets a plan of its own.
#include "backend/cuda/cublaslt.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>

namespace sparkserve {
namespace {

// The entry points used, resolved from the loaded library (the header only declares them).
struct LtApi {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtGetVersion) get_version = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  cublasLtHandle_t handle = nullptr;
  int64_t version = 0;
};

template <class F>
bool resolve(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}

// Loaded once; null when the library or one of its entry points is missing (said once on stderr).
const LtApi* api() {
  static const LtApi* loaded = [] () -> const LtApi* {
    void* lib = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      std::fprintf(stderr, "cuda: libcublasLt.so.13 not loadable (%s); tensor-core GEMMs use the fallback kernels\n",
                   dlerror());
      return nullptr;
    }
    static LtApi a;
    const bool ok = resolve(lib, "cublasLtCreate", a.create) && resolve(lib, "cublasLtGetVersion", a.get_version) &&
                    resolve(lib, "cublasLtMatmulDescCreate", a.desc_create) &&
                    resolve(lib, "cublasLtMatmulDescSetAttribute", a.desc_set) &&
                    resolve(lib, "cublasLtMatrixLayoutCreate", a.layout_create) &&
                    resolve(lib, "cublasLtMatrixLayoutDestroy", a.layout_destroy) &&
                    resolve(lib, "cublasLtMatmulPreferenceCreate", a.pref_create) &&
                    resolve(lib, "cublasLtMatmulPreferenceSetAttribute", a.pref_set) &&
                    resolve(lib, "cublasLtMatmulPreferenceDestroy", a.pref_destroy) &&
                    resolve(lib, "cublasLtMatmulAlgoGetHeuristic", a.heuristic) &&
                    resolve(lib, "cublasLtMatmul", a.matmul);
    if (!ok || a.create(&a.handle) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cuda: libcublasLt.so.13 unusable; tensor-core GEMMs use the fallback kernels\n");
      return nullptr;
    }
    a.version = static_cast<int64_t>(a.get_version());
    return &a;
  }();
  return loaded;
}

// Bytes of alignment an operand's every row start has (pointer and row stride), at most 16.
int alignment(const void* p, int64_t row_bytes) {
  const uint64_t v = reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(row_bytes) | 16u;
  return static_cast<int>(v & (~v + 1));
}

using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, size_t, int, int, int, bool>;

struct Plan {
  bool ok = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// Descriptors and the heuristic's first algorithm for one problem shape; ok false when cuBLASLt
// offers none (the plan is kept, so the question is asked once). Plans live as long as the process.
Plan make_plan(const LtApi& lt, const LtMatmul& p, size_t workspace_bytes, int align_a, int align_b, int align_d) {
  Plan plan;
  if (lt.desc_create(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return plan;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  bool ok = lt.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) == CUBLAS_STATUS_SUCCESS &&
            lt.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) == CUBLAS_STATUS_SUCCESS;
  if (p.bias) {
    // The bias is of D's type (f32) by default; its pointer is set again on every call.
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    ok = ok &&
         lt.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)) == CUBLAS_STATUS_SUCCESS &&
         lt.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)) == CUBLAS_STATUS_SUCCESS;
  }
  ok = ok &&
       lt.layout_create(&plan.la, p.ab_type, static_cast<uint64_t>(p.k), static_cast<uint64_t>(p.m), p.lda) ==
           CUBLAS_STATUS_SUCCESS &&
       lt.layout_create(&plan.lb, p.ab_type, static_cast<uint64_t>(p.k), static_cast<uint64_t>(p.n), p.ldb) ==
           CUBLAS_STATUS_SUCCESS &&
       lt.layout_create(&plan.ld, CUDA_R_32F, static_cast<uint64_t>(p.m), static_cast<uint64_t>(p.n), p.ldd) ==
           CUBLAS_STATUS_SUCCESS;
  if (!ok) return plan;
  cublasLtMatmulPreference_t pref = nullptr;
  if (lt.pref_create(&pref) != CUBLAS_STATUS_SUCCESS) return plan;
  const uint64_t ws = workspace_bytes;
  const uint32_t aa = static_cast<uint32_t>(align_a), ab = static_cast<uint32_t>(align_b),
                 ad = static_cast<uint32_t>(align_d);
  ok = lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)) == CUBLAS_STATUS_SUCCESS &&
       lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa)) == CUBLAS_STATUS_SUCCESS &&
       lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab)) == CUBLAS_STATUS_SUCCESS &&
       lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof(ad)) == CUBLAS_STATUS_SUCCESS &&
       lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof(ad)) == CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (ok && lt.heuristic(lt.handle, plan.desc, plan.la, plan.lb, plan.ld, plan.ld, pref, 1, &result, &found) ==
                CUBLAS_STATUS_SUCCESS &&
      found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    plan.algo = result.algo;
    plan.ok = true;
  }
  lt.pref_destroy(pref);
  return plan;
}

}  // namespace

bool lt_available() { return api() != nullptr; }
int64_t lt_version() { return api() ? api()->version : 0; }

namespace {
// The cached plan of p's problem (made on first sight), or null when cuBLASLt offers none.
// Callers hold plan_mutex().
std::mutex& plan_mutex() {
  static std::mutex mu;
  return mu;
}
// The token count a plan is made for: n rounded up to a power of two.
int64_t bucket_n(int64_t n) {
  int64_t b = 1;
  while (b < n) b *= 2;
  return b;
}
Plan* find_plan(const LtApi& lt, const LtMatmul& p, size_t workspace_bytes, bool exact_n) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0) return nullptr;
  const int align_a = alignment(p.a, p.lda * 2), align_b = alignment(p.b, p.ldb * 2),
            align_d = alignment(p.d, p.ldd * 4);
  static std::map<PlanKey, Plan> plans;
  LtMatmul q = p;
  // Exact plans are keyed by -n so that they never meet a bucket's.
  q.n = exact_n ? p.n : bucket_n(p.n);
  const PlanKey key{static_cast<int>(p.ab_type), p.m, exact_n ? -p.n : q.n, p.k, p.lda, p.ldb, p.ldd,
                    workspace_bytes, align_a, align_b, align_d, p.bias != nullptr};
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, make_plan(lt, q, workspace_bytes, align_a, align_b, align_d)).first;
  return it->second.ok ? &it->second : nullptr;
}

// One cublasLtMatmul of p with plan's descriptor and algorithm, on layouts of p's own n.
bool run_plan(const LtApi& lt, const Plan& plan, const LtMatmul& p, cudaStream_t s, void* workspace,
              size_t workspace_bytes) {
  cublasLtMatrixLayout_t lb = nullptr, ld = nullptr;
  bool ok = lt.layout_create(&lb, p.ab_type, static_cast<uint64_t>(p.k), static_cast<uint64_t>(p.n), p.ldb) ==
                CUBLAS_STATUS_SUCCESS &&
            lt.layout_create(&ld, CUDA_R_32F, static_cast<uint64_t>(p.m), static_cast<uint64_t>(p.n), p.ldd) ==
                CUBLAS_STATUS_SUCCESS;
  // The bias pointer is the descriptor's: set for this call (callers hold plan_mutex()).
  if (p.bias)
    ok = ok && lt.desc_set(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)) ==
                   CUBLAS_STATUS_SUCCESS;
  const float alpha = 1.0f;
  ok = ok && lt.matmul(lt.handle, plan.desc, &alpha, p.a, plan.la, p.b, lb, &p.beta, p.d, ld, p.d, ld, &plan.algo,
                       workspace, workspace_bytes, s) == CUBLAS_STATUS_SUCCESS;
  if (lb) lt.layout_destroy(lb);
  if (ld) lt.layout_destroy(ld);
  return ok;
}
}  // namespace

bool lt_plan(const LtMatmul& p, size_t workspace_bytes) {
  const LtApi* lt = api();
  if (!lt) return false;
  std::lock_guard<std::mutex> lock(plan_mutex());
  return find_plan(*lt, p, workspace_bytes, false) != nullptr || find_plan(*lt, p, workspace_bytes, true) != nullptr;
}

bool lt_matmul(const LtMatmul& p, cudaStream_t s, void* workspace, size_t workspace_bytes) {
  const LtApi* lt = api();
  if (!lt) return false;
  std::lock_guard<std::mutex> lock(plan_mutex());
  for (bool exact : {false, true}) {
    const Plan* plan = find_plan(*lt, p, workspace_bytes, exact);
    if (plan && run_plan(*lt, *plan, p, s, workspace, workspace_bytes)) return true;
    if (bucket_n(p.n) == p.n) break;  // the bucket's plan was the exact one
  }
  return false;
}

}  // namespace sparkserve
