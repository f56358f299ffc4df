// Elementwise kernels of a training step on a GPU: the exact GELU and dropout.
//
// Each thread starts at its global index and strides by the grid's size, so any grid covers any
// array. The definitions are those of the CPU kernels (minitensor/kernels/gelu.py and fused.py),
// and dropout's random numbers are the very same: element i of a mask drawn with seed s is kept on
// the GPU exactly when it is kept on the CPU.

__device__ __forceinline__ float complementary_erf(float v) { return erfcf(v); }
__device__ __forceinline__ double complementary_erf(double v) { return erfc(v); }
__device__ __forceinline__ float exponential(float v) { return expf(v); }
__device__ __forceinline__ double exponential(double v) { return exp(v); }

struct GridStride {
    long long first, stride;
};

__device__ __forceinline__ GridStride grid_stride() {
    return GridStride{(long long)blockIdx.x * blockDim.x + threadIdx.x, (long long)gridDim.x * blockDim.x};
}

// ---------------------------------------------------------------------------------------------
// GELU(x) = x * Phi(x), Phi(x) = erfc(-x / sqrt 2) / 2;  GELU'(x) = Phi(x) + x * phi(x)
// ---------------------------------------------------------------------------------------------
template <typename T>
__device__ void gelu_forward(const T* __restrict__ x, T* __restrict__ y, long long size) {
    const GridStride g = grid_stride();
    for (long long i = g.first; i < size; i += g.stride) {
        const T v = x[i];
        y[i] = v * (T(0.5) * complementary_erf(-v * T(0.70710678118654752440)));
    }
}

template <typename T>
__device__ void gelu_backward(const T* __restrict__ x, const T* __restrict__ grad, T* __restrict__ dx,
                              long long size) {
    const GridStride g = grid_stride();
    for (long long i = g.first; i < size; i += g.stride) {
        const T v = x[i];
        const T cdf = T(0.5) * complementary_erf(-v * T(0.70710678118654752440));
        const T pdf = T(0.39894228040143267794) * exponential(T(-0.5) * v * v);  // 1 / sqrt(2 pi)
        dx[i] = grad[i] * (cdf + v * pdf);
    }
}

// ---------------------------------------------------------------------------------------------
// Dropout with counter-based random numbers (see fused.py): element i's number is a hash of
// (seed, i), SplitMix64's i-th output (Steele et al., 2014), so no generator state is read or
// written, and backward makes the same mask again from the seed.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ unsigned long long uniform_bits(unsigned long long seed, unsigned long long i) {
    unsigned long long z = seed + (i + 1) * 0x9E3779B97F4A7C15ULL;  // wraps around mod 2^64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z = z ^ (z >> 31);
    return z >> 32;  // the top 32 bits: uniform over [0, 2^32)
}

// y_i = x_i * scale if bits(seed, i) >= threshold else 0, with threshold = round(p * 2^32) and
// scale = 1 / (1 - p); the backward is the same function applied to the gradient.
template <typename T>
__device__ void dropout(const T* __restrict__ x, T* __restrict__ y, long long size, unsigned long long seed,
                        unsigned long long threshold, T scale) {
    const GridStride g = grid_stride();
    for (long long i = g.first; i < size; i += g.stride)
        y[i] = uniform_bits(seed, (unsigned long long)i) >= threshold ? x[i] * scale : T(0);
}

extern "C" __global__ void gelu_forward_float32(const float* x, float* y, long long size) {
    gelu_forward<float>(x, y, size);
}
extern "C" __global__ void gelu_forward_float64(const double* x, double* y, long long size) {
    gelu_forward<double>(x, y, size);
}
extern "C" __global__ void gelu_backward_float32(const float* x, const float* grad, float* dx, long long size) {
    gelu_backward<float>(x, grad, dx, size);
}
extern "C" __global__ void gelu_backward_float64(const double* x, const double* grad, double* dx, long long size) {
    gelu_backward<double>(x, grad, dx, size);
}
extern "C" __global__ void dropout_float32(const float* x, float* y, long long size, unsigned long long seed,
                                           unsigned long long threshold, float scale) {
    dropout<float>(x, y, size, seed, threshold, scale);
}
extern "C" __global__ void dropout_float64(const double* x, double* y, long long size, unsigned long long seed,
                                           unsigned long long threshold, double scale) {
    dropout<double>(x, y, size, seed, threshold, scale);
}
