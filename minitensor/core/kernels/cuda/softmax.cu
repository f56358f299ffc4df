// Row-wise softmax and log-softmax on a GPU, forward and backward: the four kernels of
// minitensor/core/kernels/cpu.py with the same contract and the same numerics (the derivations are
// there). x is a C-contiguous (rows, n) array; a masked kernel also takes lens, one valid length
// per row (clipped to [0, n]): entries at or after it give 0 (softmax) or -inf (log-softmax), and
// a row with nothing valid, or only -inf, gives all 0 / all -inf, never NaN.
//
// One warp per row. A warp's 32 lanes stride over the row's columns (lane l takes columns
// l, l + 32, ...), so neighbouring lanes read neighbouring addresses (coalesced), and the numbers
// a row needs (its max, its sum of exponentials) are combined across the lanes with register
// shuffles: no shared memory, no __syncthreads. A block holds several warps, so several rows; a
// grid with fewer warps than rows strides over them.
//
// The forward reads the row twice, not three times: each lane keeps a running max m and a sum
// s of exp(x - m) (the "online softmax" of Milakov & Gimelshein, 2018), rescaling s whenever m
// grows: s <- s * exp(m_old - m_new). Two lanes' pairs combine the same way, so one butterfly of
// shuffles gives every lane the row's (max, sum); the second read writes exp(x - max) / sum.

template <typename T>
__device__ __forceinline__ T negative_infinity();
template <>
__device__ __forceinline__ float negative_infinity<float>() {
    return -__int_as_float(0x7f800000);
}
template <>
__device__ __forceinline__ double negative_infinity<double>() {
    return -__longlong_as_double(0x7ff0000000000000LL);
}

__device__ __forceinline__ float exponential(float v) { return expf(v); }
__device__ __forceinline__ double exponential(double v) { return exp(v); }
__device__ __forceinline__ float logarithm(float v) { return logf(v); }
__device__ __forceinline__ double logarithm(double v) { return log(v); }

// max with NaN winning, as in cpu.py: a NaN anywhere in the row makes the row NaN
template <typename T>
__device__ __forceinline__ T max_or_nan(T a, T b) {
    return (b > a || b != b) ? b : a;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// The running (max, sum of exp(x - max)) of two halves, combined. Both maxima -inf: the union
// is empty too (exp(-inf - -inf) would be NaN).
template <typename T>
__device__ __forceinline__ void combine(T& m, T& s, T m2, T s2) {
    T joint = max_or_nan(m, m2);
    s = joint == negative_infinity<T>() ? T(0) : s * exponential(m - joint) + s2 * exponential(m2 - joint);
    m = joint;
}

// Which row this warp takes first, and how far it strides.
struct WarpRows {
    long long first, stride;
    int lane;
};

__device__ __forceinline__ WarpRows warp_rows() {
    const int warps_per_block = blockDim.x / 32;
    return WarpRows{(long long)blockIdx.x * warps_per_block + threadIdx.x / 32,
                    (long long)gridDim.x * warps_per_block, (int)(threadIdx.x % 32)};
}

template <typename T, bool LOG>
__device__ void softmax_rows(const T* __restrict__ x, const long long* __restrict__ lens, T* __restrict__ y,
                             long long rows, long long n) {
    const T ninf = negative_infinity<T>();
    const WarpRows w = warp_rows();
    for (long long row = w.first; row < rows; row += w.stride) {
        const T* xr = x + row * n;
        T* yr = y + row * n;
        long long length = n;
        if (lens != nullptr) length = lens[row] < 0 ? 0 : (lens[row] > n ? n : lens[row]);

        // read 1: this lane's (max, sum), then the row's, in every lane
        T m = ninf, s = T(0);
        for (long long j = w.lane; j < length; j += 32) {
            T v = xr[j];
            if (v == ninf) continue;  // adds exp(-inf) = 0; m - v would be NaN while m is -inf
            if (v > m || v != v) {
                s *= exponential(m - v);  // the sum so far, relative to the new max
                m = v;
            }
            s += exponential(v - m);
        }
        for (int offset = 16; offset > 0; offset /= 2)
            combine(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
        // combine(a, b) and combine(b, a) may round differently (a GPU fuses s * e + s2 * e2 into
        // one multiply-add, which is not symmetric): every lane takes lane 0's sum, so that one
        // row is divided by one number
        s = __shfl_sync(0xffffffffu, s, 0);

        // read 2: write the row (the same branch in all 32 lanes: they hold the same m)
        if (m == ninf) {  // an empty distribution: softmax 0, log-softmax log 0
            for (long long j = w.lane; j < n; j += 32) yr[j] = LOG ? ninf : T(0);
            continue;
        }
        if (LOG) {
            const T log_total = logarithm(s);
            for (long long j = w.lane; j < length; j += 32) yr[j] = (xr[j] - m) - log_total;  // cpu._subtract_twice
            for (long long j = length + w.lane; j < n; j += 32) yr[j] = ninf;
        } else {
            const T scale = T(1) / s;  // s >= 1: the max contributes exp(0)
            for (long long j = w.lane; j < length; j += 32) yr[j] = exponential(xr[j] - m) * scale;
            for (long long j = length + w.lane; j < n; j += 32) yr[j] = T(0);
        }
    }
}

// dx = y * (g - sum_j g_j y_j), per row; masked entries have y = 0 and get dx = 0.
template <typename T>
__device__ void softmax_backward_rows(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ dx,
                                      long long rows, long long n) {
    const WarpRows w = warp_rows();
    for (long long row = w.first; row < rows; row += w.stride) {
        const T *yr = y + row * n, *gr = g + row * n;
        T partial = T(0);
        for (long long j = w.lane; j < n; j += 32) partial += gr[j] * yr[j];
        const T weighted = warp_sum(partial);
        for (long long j = w.lane; j < n; j += 32) dx[row * n + j] = yr[j] * (gr[j] - weighted);
    }
}

// dx_j = g_j - exp(y_j) * sum_{k: y_k finite} g_k; 0 where y_j = -inf (masked or empty).
template <typename T>
__device__ void log_softmax_backward_rows(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ dx,
                                          long long rows, long long n) {
    const T ninf = negative_infinity<T>();
    const WarpRows w = warp_rows();
    for (long long row = w.first; row < rows; row += w.stride) {
        const T *yr = y + row * n, *gr = g + row * n;
        T partial = T(0);
        for (long long j = w.lane; j < n; j += 32)
            if (yr[j] != ninf) partial += gr[j];
        const T total = warp_sum(partial);
        for (long long j = w.lane; j < n; j += 32)
            dx[row * n + j] = yr[j] != ninf ? gr[j] - exponential(yr[j]) * total : T(0);
    }
}

// The kernels, by name and dtype (C names, so that the launcher finds them without C++ mangling).
extern "C" __global__ void softmax_forward_float32(const float* x, float* y, long long rows, long long n) {
    softmax_rows<float, false>(x, nullptr, y, rows, n);
}
extern "C" __global__ void softmax_forward_float64(const double* x, double* y, long long rows, long long n) {
    softmax_rows<double, false>(x, nullptr, y, rows, n);
}
extern "C" __global__ void masked_softmax_forward_float32(const float* x, const long long* lens, float* y,
                                                          long long rows, long long n) {
    softmax_rows<float, false>(x, lens, y, rows, n);
}
extern "C" __global__ void masked_softmax_forward_float64(const double* x, const long long* lens, double* y,
                                                          long long rows, long long n) {
    softmax_rows<double, false>(x, lens, y, rows, n);
}
extern "C" __global__ void log_softmax_forward_float32(const float* x, float* y, long long rows, long long n) {
    softmax_rows<float, true>(x, nullptr, y, rows, n);
}
extern "C" __global__ void log_softmax_forward_float64(const double* x, double* y, long long rows, long long n) {
    softmax_rows<double, true>(x, nullptr, y, rows, n);
}
extern "C" __global__ void masked_log_softmax_forward_float32(const float* x, const long long* lens, float* y,
                                                              long long rows, long long n) {
    softmax_rows<float, true>(x, lens, y, rows, n);
}
extern "C" __global__ void masked_log_softmax_forward_float64(const double* x, const long long* lens, double* y,
                                                              long long rows, long long n) {
    softmax_rows<double, true>(x, lens, y, rows, n);
}
extern "C" __global__ void softmax_backward_float32(const float* y, const float* g, float* dx, long long rows,
                                                    long long n) {
    softmax_backward_rows<float>(y, g, dx, rows, n);
}
extern "C" __global__ void softmax_backward_float64(const double* y, const double* g, double* dx, long long rows,
                                                    long long n) {
    softmax_backward_rows<double>(y, g, dx, rows, n);
}
extern "C" __global__ void log_softmax_backward_float32(const float* y, const float* g, float* dx, long long rows,
                                                        long long n) {
    log_softmax_backward_rows<float>(y, g, dx, rows, n);
}
extern "C" __global__ void log_softmax_backward_float64(const double* y, const double* g, double* dx,
                                                        long long rows, long long n) {
    log_softmax_backward_rows<double>(y, g, dx, rows, n);
}
