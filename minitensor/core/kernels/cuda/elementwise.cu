// Elementwise kernels of a training step on a GPU: the exact GELU, dropout, ReLU, Adam's update
// and mt.autocast's conversions between float32 and bfloat16. Each replaces several CuPy operators
// (a launch and a pass over memory each) by one.
//
// Each thread starts at its global index and strides by the grid's size, so any grid covers any
// array. The definitions are those of the CPU kernels (minitensor/core/kernels/gelu.py and fused.py),
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
// Dropout with counter-based random numbers (random.cuh): element i's number is a hash of
// (seed, i), so no generator state is read or written, and backward makes the same mask again.
// ---------------------------------------------------------------------------------------------
#include "random.cuh"

// y_i = x_i * scale if bits(seed, i) >= threshold else 0, with threshold = round(p * 2^32) and
// scale = 1 / (1 - p); the backward is the same function applied to the gradient.
template <typename T>
__device__ void dropout(const T* __restrict__ x, T* __restrict__ y, long long size, unsigned long long seed,
                        unsigned long long threshold, T scale) {
    const GridStride g = grid_stride();
    for (long long i = g.first; i < size; i += g.stride)
        y[i] = uniform_bits(seed, (unsigned long long)i) >= threshold ? x[i] * scale : T(0);
}

// ---------------------------------------------------------------------------------------------
// ReLU: max(x, 0) (NaN stays NaN), and its gradient g * (y > 0) (a product, so NaN * 0 is NaN)
// ---------------------------------------------------------------------------------------------
template <typename T>
__device__ void relu_forward(const T* __restrict__ x, T* __restrict__ y, long long size) {
    const GridStride g = grid_stride();
    for (long long i = g.first; i < size; i += g.stride) y[i] = x[i] <= T(0) ? T(0) : x[i];
}

template <typename T>
__device__ void relu_backward(const T* __restrict__ y, const T* __restrict__ grad, T* __restrict__ dx,
                              long long size) {
    const GridStride g = grid_stride();
    for (long long i = g.first; i < size; i += g.stride) dx[i] = grad[i] * T(y[i] > T(0));
}

// ---------------------------------------------------------------------------------------------
// Adam's update of one parameter, in place (the rule of optim/adam.py, as fused.adam_update):
//   g <- g + weight_decay w;  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   w <- w - step_size m / (sqrt(v) / bias_sqrt2 + eps)
// ---------------------------------------------------------------------------------------------
template <typename T>
__device__ void adam_update(T* __restrict__ w, const T* __restrict__ grad, T* __restrict__ m, T* __restrict__ v,
                            long long size, T step_size, T b1, T one_minus_b1, T b2, T one_minus_b2, T eps,
                            T weight_decay, T bias_sqrt2) {
    const GridStride g = grid_stride();
    for (long long i = g.first; i < size; i += g.stride) {
        const T gi = grad[i] + weight_decay * w[i];
        const T mi = b1 * m[i] + one_minus_b1 * gi;
        const T vi = b2 * v[i] + one_minus_b2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        w[i] -= step_size * mi / (sqrt(vi) / bias_sqrt2 + eps);
    }
}

// ---------------------------------------------------------------------------------------------
// float32 <-> bfloat16 on the bits (kernels/bfloat16.py): a float32 u (as an unsigned integer)
// narrows to h = (u + 0x7FFF + ((u >> 16) & 1)) >> 16, to nearest with ties to even, a NaN kept
// one; h widens to h << 16, exactly; a rounding in place of a float32 is both, one pass.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ unsigned int bfloat16_narrowed(unsigned int u) {
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 0x0040u;  // NaN: stays one, quiet
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

extern "C" __global__ void bfloat16_narrow(const unsigned int* x, unsigned short* h, long long size) {
    const GridStride g = grid_stride();
    for (long long i = g.first; i < size; i += g.stride) h[i] = (unsigned short)bfloat16_narrowed(x[i]);
}
extern "C" __global__ void bfloat16_round(const unsigned int* x, unsigned int* r, long long size) {
    const GridStride g = grid_stride();
    for (long long i = g.first; i < size; i += g.stride) r[i] = bfloat16_narrowed(x[i]) << 16;
}
extern "C" __global__ void bfloat16_widen(const unsigned short* h, unsigned int* x, long long size) {
    const GridStride g = grid_stride();
    for (long long i = g.first; i < size; i += g.stride) x[i] = (unsigned int)h[i] << 16;
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
                                           const unsigned long long* seed_at, unsigned long long threshold,
                                           float scale) {
    dropout<float>(x, y, size, read_seed(seed, seed_at), threshold, scale);
}
extern "C" __global__ void dropout_float64(const double* x, double* y, long long size, unsigned long long seed,
                                           const unsigned long long* seed_at, unsigned long long threshold,
                                           double scale) {
    dropout<double>(x, y, size, read_seed(seed, seed_at), threshold, scale);
}
// seeds[i] = splitmix64(key ^ (first + i)) >> 2 with key = splitmix64(seed): draw number first + i
// of the CuPy backend's draw_seed, made on the device, where a captured graph reads its seeds
extern "C" __global__ void draw_seeds(unsigned long long* seeds, long long count, unsigned long long key,
                                      unsigned long long first) {
    const GridStride g = grid_stride();
    for (long long i = g.first; i < count; i += g.stride) seeds[i] = splitmix64(key ^ (first + i)) >> 2;
}
extern "C" __global__ void relu_forward_float32(const float* x, float* y, long long size) {
    relu_forward<float>(x, y, size);
}
extern "C" __global__ void relu_forward_float64(const double* x, double* y, long long size) {
    relu_forward<double>(x, y, size);
}
extern "C" __global__ void relu_backward_float32(const float* y, const float* grad, float* dx, long long size) {
    relu_backward<float>(y, grad, dx, size);
}
extern "C" __global__ void relu_backward_float64(const double* y, const double* grad, double* dx, long long size) {
    relu_backward<double>(y, grad, dx, size);
}
extern "C" __global__ void adam_update_float32(float* w, const float* grad, float* m, float* v, long long size,
                                               float step_size, float b1, float one_minus_b1, float b2,
                                               float one_minus_b2, float eps, float weight_decay, float bias_sqrt2) {
    adam_update<float>(w, grad, m, v, size, step_size, b1, one_minus_b1, b2, one_minus_b2, eps, weight_decay,
                       bias_sqrt2);
}
extern "C" __global__ void adam_update_float64(double* w, const double* grad, double* m, double* v, long long size,
                                               double step_size, double b1, double one_minus_b1, double b2,
                                               double one_minus_b2, double eps, double weight_decay,
                                               double bias_sqrt2) {
    adam_update<double>(w, grad, m, v, size, step_size, b1, one_minus_b1, b2, one_minus_b2, eps, weight_decay,
                        bias_sqrt2);
}
