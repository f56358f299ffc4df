// Multi-tensor kernels: one launch over every tensor of a list (PyTorch's multi_tensor_apply,
// after NVIDIA's apex), for the optimiser's step and gradient clipping.
//
// Why: a small model's training step on a GPU is bound by launches, not by memory: each launch
// costs the host more time than a kernel on a few thousand elements runs. Updating 51 parameters
// one kernel each, and clipping them with a norm (three launches) and a scale (two) each, is
// ~360 launches per step (bench/launches.py counts them). These kernels do the same work in one
// launch (Adam), two (the norm) and one (the scale).
//
// The tensors are given by a table on the device, uploaded by the launcher:
//   addresses  the tensors' device addresses as 64-bit integers (for Adam four rows of n:
//              parameters, gradients, first moments, second moments)
//   offsets    n + 1 running sizes: tensor t holds elements [offsets[t], offsets[t + 1]) of the
//              concatenation of all of them, which has offsets[n] elements
// The concatenated index space is cut into chunks of `chunk` elements; block b takes chunks b,
// b + gridDim.x, ... (so any grid covers any list), finds the tensor where its chunk starts by a
// binary search of `offsets`, and walks the tensors that the chunk overlaps, its threads striding
// over each overlap. A chunk may span several small tensors and a large tensor several chunks;
// an empty tensor is never visited. Every thread of a block takes the same path (the search and
// the walk depend only on the chunk), so the block-wide barriers of the sum below are safe.
// (apex instead gives each block one (tensor, chunk) pair from a table in the kernel's
// arguments; the binary search needs only the running sizes.)

// The tensor that holds element `i` of the concatenation: the last t with offsets[t] <= i.
__device__ __forceinline__ long long tensor_of(const long long* __restrict__ offsets, long long n, long long i) {
    long long lo = 0, hi = n - 1;
    while (lo < hi) {
        const long long mid = (lo + hi + 1) / 2;
        if (offsets[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Calls visit(tensor, j) for each element j of each tensor that chunk [start, end) overlaps,
// element k of the chunk on thread k % blockDim.x.
template <typename Visit>
__device__ __forceinline__ void for_chunk(const long long* __restrict__ offsets, long long n, long long start,
                                          long long end, Visit visit) {
    for (long long t = tensor_of(offsets, n, start); t < n && offsets[t] < end; ++t) {
        const long long first = max(start, offsets[t]) - offsets[t], last = min(end, offsets[t + 1]) - offsets[t];
        for (long long j = first + threadIdx.x; j < last; j += blockDim.x) visit(t, j);
    }
}

// ---------------------------------------------------------------------------------------------
// Adam's update of every parameter of a group, in place: elementwise.cu's adam_update element for
// element (the same lines, so the same bits; tests/test_multi_tensor.py checks it), preceded by
// AdamW's decoupled decay w <- decay w (decay = 1 - lr weight_decay; 1 for Adam):
//   w <- decay w;  g <- g + weight_decay w;  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   w <- w - step_size m / (sqrt(v) / bias_sqrt2 + eps)
// The scalars are those of elementwise.cu's kernel: the parameters share one step count t.
// ---------------------------------------------------------------------------------------------
template <typename T>
__device__ void adam_update_multi(const unsigned long long* __restrict__ addresses,
                                  const long long* __restrict__ offsets, long long n, long long chunk, T step_size,
                                  T b1, T one_minus_b1, T b2, T one_minus_b2, T eps, T weight_decay, T bias_sqrt2,
                                  T decay) {
    const long long total = offsets[n];
    for (long long start = (long long)blockIdx.x * chunk; start < total; start += (long long)gridDim.x * chunk) {
        for_chunk(offsets, n, start, min(start + chunk, total), [&](long long t, long long i) {
            T* w = reinterpret_cast<T*>(addresses[t]);
            const T* grad = reinterpret_cast<const T*>(addresses[n + t]);
            T* m = reinterpret_cast<T*>(addresses[2 * n + t]);
            T* v = reinterpret_cast<T*>(addresses[3 * n + t]);
            const T wi = w[i] * decay;
            const T gi = grad[i] + weight_decay * wi;
            const T mi = b1 * m[i] + one_minus_b1 * gi;
            const T vi = b2 * v[i] + one_minus_b2 * gi * gi;
            m[i] = mi;
            v[i] = vi;
            w[i] = wi - step_size * mi / (sqrt(vi) / bias_sqrt2 + eps);
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Gradient clipping: ||g|| of all the tensors as one vector, and clip_grad_norm_'s factor, in two
// launches and without a read on the host.
//   sum_of_squares_partial: block b adds up x^2 over its chunks into partial[b] (in double, so a
//       long float32 sum loses nothing), its threads' sums combined by a tree in shared memory;
//   sum_of_squares_finish: one block adds up the partials the same way and writes
//       norm = sqrt(sum) (in T) and factor = min(1, max_norm / (norm + 1e-6)) (1 for a non-finite
//       norm), computed in double from the rounded norm as nn/utils.py does, then rounded to T.
// No atomics: each sum is made in an order fixed by the grid, so the norm is the same bits at
// every run (the grid is chosen from the sizes alone).
// ---------------------------------------------------------------------------------------------
constexpr int MAX_SUM_THREADS = 1024;

// The sum of every thread's `value` over the block (valid on thread 0), in a fixed order.
__device__ __forceinline__ double block_sum(double value) {
    __shared__ double sums[MAX_SUM_THREADS];
    sums[threadIdx.x] = value;
    __syncthreads();
    unsigned half = 1;
    while (half < blockDim.x) half *= 2;
    for (half /= 2; half > 0; half /= 2) {
        if (threadIdx.x < half && threadIdx.x + half < blockDim.x) sums[threadIdx.x] += sums[threadIdx.x + half];
        __syncthreads();
    }
    const double total = sums[0];
    __syncthreads();  // everyone has read sums[0] before a later call writes it
    return total;
}

template <typename T>
__device__ void sum_of_squares_partial(const unsigned long long* __restrict__ addresses,
                                       const long long* __restrict__ offsets, long long n, long long chunk,
                                       double* __restrict__ partial) {
    const long long total = offsets[n];
    double sum = 0.0;
    for (long long start = (long long)blockIdx.x * chunk; start < total; start += (long long)gridDim.x * chunk) {
        for_chunk(offsets, n, start, min(start + chunk, total), [&](long long t, long long i) {
            const double x = reinterpret_cast<const T*>(addresses[t])[i];
            sum += x * x;
        });
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

template <typename T>
__device__ void sum_of_squares_finish(const double* __restrict__ partial, long long partials, T* __restrict__ norm,
                                      T* __restrict__ factor, double max_norm) {
    double sum = 0.0;
    for (long long b = threadIdx.x; b < partials; b += blockDim.x) sum += partial[b];
    sum = block_sum(sum);
    if (threadIdx.x == 0) {
        const T rounded = T(sqrt(sum));
        const double value = rounded, scale = max_norm / (value + 1e-6);
        norm[0] = rounded;
        factor[0] = T(isfinite(value) && scale < 1.0 ? scale : 1.0);
    }
}

// Every element of every tensor times factor[0], in place: clip_grad_norm_'s rescaling.
template <typename T>
__device__ void scale_multi(const unsigned long long* __restrict__ addresses, const long long* __restrict__ offsets,
                            long long n, long long chunk, const T* __restrict__ factor) {
    const long long total = offsets[n];
    const T f = factor[0];
    for (long long start = (long long)blockIdx.x * chunk; start < total; start += (long long)gridDim.x * chunk) {
        for_chunk(offsets, n, start, min(start + chunk, total), [&](long long t, long long i) {
            reinterpret_cast<T*>(addresses[t])[i] *= f;
        });
    }
}

#define MULTI_TENSOR_KERNELS(T, NAME)                                                                                \
    extern "C" __global__ void adam_update_multi_##NAME(                                                             \
        const unsigned long long* addresses, const long long* offsets, long long n, long long chunk, T step_size,   \
        T b1, T one_minus_b1, T b2, T one_minus_b2, T eps, T weight_decay, T bias_sqrt2, T decay) {                  \
        adam_update_multi<T>(addresses, offsets, n, chunk, step_size, b1, one_minus_b1, b2, one_minus_b2, eps,       \
                             weight_decay, bias_sqrt2, decay);                                                       \
    }                                                                                                                \
    extern "C" __global__ void sum_of_squares_partial_##NAME(const unsigned long long* addresses,                   \
                                                             const long long* offsets, long long n, long long chunk, \
                                                             double* partial) {                                      \
        sum_of_squares_partial<T>(addresses, offsets, n, chunk, partial);                                            \
    }                                                                                                                \
    extern "C" __global__ void sum_of_squares_finish_##NAME(const double* partial, long long partials, T* norm,     \
                                                            T* factor, double max_norm) {                            \
        sum_of_squares_finish<T>(partial, partials, norm, factor, max_norm);                                         \
    }                                                                                                                \
    extern "C" __global__ void scale_multi_##NAME(const unsigned long long* addresses, const long long* offsets,    \
                                                  long long n, long long chunk, const T* factor) {                   \
        scale_multi<T>(addresses, offsets, n, chunk, factor);                                                        \
    }

MULTI_TENSOR_KERNELS(float, float32)
MULTI_TENSOR_KERNELS(double, float64)
