// Layer normalisation on a GPU, forward and backward: fused.layer_norm_forward / _backward (and
// ops/norm.py's definition) in one launch each way, plus one for the parameters' gradients.
//
//   mu = mean(x),  var = mean((x - mu)^2),  rstd = 1 / sqrt(var + eps),  xhat = (x - mu) rstd
//   y = xhat * weight + bias
//   dx = rstd (g w - mean(g w) - xhat mean(g w xhat)),  dweight = sum_rows g xhat,  dbias = sum_rows g
//
// Rows as in softmax.cu: one warp per row, its lanes striding over the columns, the row's sums
// combined with register shuffles. The parameters' gradients sum over rows instead: a grid of
// (column block, chunk of rows) threads, each summing its chunk of one column into `partial`
// (chunks x D), and a third launch adds the chunks up, both gradients at once, in chunk order; no
// two threads write the same memory, so the result does not depend on scheduling.

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float inverse_sqrt(float v) { return 1.0f / sqrtf(v); }
__device__ __forceinline__ double inverse_sqrt(double v) { return 1.0 / sqrt(v); }

template <typename T>
__device__ void layer_norm_forward(const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                                   T* __restrict__ y, T* __restrict__ xhat, T* __restrict__ rstd, long long rows,
                                   long long n, T eps) {
    const int warps_per_block = blockDim.x / 32, lane = threadIdx.x % 32;
    for (long long row = (long long)blockIdx.x * warps_per_block + threadIdx.x / 32; row < rows;
         row += (long long)gridDim.x * warps_per_block) {
        const T* xr = x + row * n;
        T sum = T(0);
        for (long long j = lane; j < n; j += 32) sum += xr[j];
        const T mean = warp_sum(sum) / T(n);
        T squares = T(0);
        for (long long j = lane; j < n; j += 32) {
            const T c = xr[j] - mean;
            squares += c * c;
        }
        const T r = inverse_sqrt(warp_sum(squares) / T(n) + eps);
        if (lane == 0) rstd[row] = r;
        for (long long j = lane; j < n; j += 32) {
            const T h = (xr[j] - mean) * r;
            xhat[row * n + j] = h;
            y[row * n + j] = h * weight[j] + bias[j];
        }
    }
}

template <typename T>
__device__ void layer_norm_backward_rows(const T* __restrict__ grad, const T* __restrict__ xhat,
                                         const T* __restrict__ rstd, const T* __restrict__ weight, T* __restrict__ dx,
                                         long long rows, long long n) {
    const int warps_per_block = blockDim.x / 32, lane = threadIdx.x % 32;
    for (long long row = (long long)blockIdx.x * warps_per_block + threadIdx.x / 32; row < rows;
         row += (long long)gridDim.x * warps_per_block) {
        const T *gr = grad + row * n, *hr = xhat + row * n;
        T a = T(0), b = T(0);
        for (long long j = lane; j < n; j += 32) {
            const T gh = gr[j] * weight[j];
            a += gh;
            b += gh * hr[j];
        }
        a = warp_sum(a) / T(n);
        b = warp_sum(b) / T(n);
        const T r = rstd[row];
        for (long long j = lane; j < n; j += 32) dx[row * n + j] = r * (gr[j] * weight[j] - a - hr[j] * b);
    }
}

// partial_w[c, j] = sum of grad[i, j] xhat[i, j] over the rows i of chunk c; partial_b the same of grad.
template <typename T>
__device__ void layer_norm_backward_columns(const T* __restrict__ grad, const T* __restrict__ xhat,
                                            T* __restrict__ partial_w, T* __restrict__ partial_b, long long rows,
                                            long long n, long long chunks) {
    const long long column_blocks = (n + blockDim.x - 1) / blockDim.x;
    const long long chunk = blockIdx.x / column_blocks;
    const long long j = (blockIdx.x % column_blocks) * blockDim.x + threadIdx.x;
    if (j >= n || chunk >= chunks) return;
    T w = T(0), b = T(0);
    for (long long i = chunk * rows / chunks; i < (chunk + 1) * rows / chunks; ++i) {
        w += grad[i * n + j] * xhat[i * n + j];
        b += grad[i * n + j];
    }
    partial_w[chunk * n + j] = w;
    partial_b[chunk * n + j] = b;
}

// dweight[j] = sum over the chunks c of partial_w[c, j], dbias[j] the same of partial_b.
template <typename T>
__device__ void layer_norm_backward_finish(const T* __restrict__ partial_w, const T* __restrict__ partial_b,
                                           T* __restrict__ dweight, T* __restrict__ dbias, long long n,
                                           long long chunks) {
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (long long)gridDim.x * blockDim.x) {
        T w = T(0), b = T(0);
        for (long long c = 0; c < chunks; ++c) {
            w += partial_w[c * n + j];
            b += partial_b[c * n + j];
        }
        dweight[j] = w;
        dbias[j] = b;
    }
}

extern "C" __global__ void layer_norm_forward_float32(const float* x, const float* weight, const float* bias, float* y,
                                                      float* xhat, float* rstd, long long rows, long long n,
                                                      float eps) {
    layer_norm_forward<float>(x, weight, bias, y, xhat, rstd, rows, n, eps);
}
extern "C" __global__ void layer_norm_forward_float64(const double* x, const double* weight, const double* bias,
                                                      double* y, double* xhat, double* rstd, long long rows,
                                                      long long n, double eps) {
    layer_norm_forward<double>(x, weight, bias, y, xhat, rstd, rows, n, eps);
}
extern "C" __global__ void layer_norm_backward_rows_float32(const float* grad, const float* xhat, const float* rstd,
                                                            const float* weight, float* dx, long long rows,
                                                            long long n) {
    layer_norm_backward_rows<float>(grad, xhat, rstd, weight, dx, rows, n);
}
extern "C" __global__ void layer_norm_backward_rows_float64(const double* grad, const double* xhat,
                                                            const double* rstd, const double* weight, double* dx,
                                                            long long rows, long long n) {
    layer_norm_backward_rows<double>(grad, xhat, rstd, weight, dx, rows, n);
}
extern "C" __global__ void layer_norm_backward_columns_float32(const float* grad, const float* xhat, float* partial_w,
                                                               float* partial_b, long long rows, long long n,
                                                               long long chunks) {
    layer_norm_backward_columns<float>(grad, xhat, partial_w, partial_b, rows, n, chunks);
}
extern "C" __global__ void layer_norm_backward_columns_float64(const double* grad, const double* xhat,
                                                               double* partial_w, double* partial_b, long long rows,
                                                               long long n, long long chunks) {
    layer_norm_backward_columns<double>(grad, xhat, partial_w, partial_b, rows, n, chunks);
}
extern "C" __global__ void layer_norm_backward_finish_float32(const float* partial_w, const float* partial_b,
                                                              float* dweight, float* dbias, long long n,
                                                              long long chunks) {
    layer_norm_backward_finish<float>(partial_w, partial_b, dweight, dbias, n, chunks);
}
extern "C" __global__ void layer_norm_backward_finish_float64(const double* partial_w, const double* partial_b,
                                                              double* dweight, double* dbias, long long n,
                                                              long long chunks) {
    layer_norm_backward_finish<double>(partial_w, partial_b, dweight, dbias, n, chunks);
}
