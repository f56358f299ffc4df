// Streamed attention (FlashAttention) on a GPU: out = softmax(scale Q K^T + bias, masked) V without
// the (Q, K) scores, forward and backward, the bias relative (see Bias) or none. The algorithm is
// minitensor/core/ops/flash_attention.py's (and tutorial 10's): for each query row a running max
// m, a running sum l of exp(s - m) and a running output o = sum exp(s - m) v, rescaled whenever m
// grows; backward recomputes each weight from the saved log-sum-exp, p = exp(s - lse). What
// changes on a GPU is who does what:
//
// * Forward and dQ: one block per (batch, head, tile of 64 queries), SPLIT threads per query row
//   (two, or four for the widest rows), each holding its part of the row (as in dK/dV below).
//   The block walks over the keys in tiles of 32: its threads copy a tile of K and V into shared
//   memory together, then each thread runs its own row against the tile. All threads read the
//   same key at the same time (or `splits` keys, see below), so shared memory serves them with
//   one broadcast.
// * dK and dV: one block per (batch, key/value head, tile of 64 keys), SPLIT threads per key row,
//   each holding its part of the row's k, v, dK and dV (four whole rows would not fit in a thread's
//   registers), walking over the queries in tiles of 16 (Q, dO, lse and D in shared memory); the
//   parts of each dot product meet through register shuffles. A key's gradient sums over
//   every query that sees it, of every query head of its group, so the threads of each key row
//   own its sums: no atomics, and the result is the same from run to run.
//
// A row is D numbers, D a compile-time size at least the head's d (the rest zeros), so the loops
// over it unroll. A thread holds at most 128 bytes of each row it keeps (32 floats, 16 doubles):
// SPLIT = 2 threads per row, 4 for rows of 128 floats or 64 doubles (with two, each thread of
// dK/dV would hold half of four such rows, 256 numbers: more registers than a thread has, and
// the rest would spill to memory).
// The row is dealt out to its threads in 16-byte chunks, chunk c to thread c % SPLIT, so that the
// threads of a row read neighbouring chunks of a shared tile, in different banks of shared
// memory, at the same time (halves, a part apart, would sit in the same banks and take turns).
//
// A small grid (one sequence of 1,024 tokens, 8 heads: 8,192 query rows, 16,384 threads) leaves
// most of a large GPU's cores waiting: each multiprocessor keeps 8 to 16 warps of these kernels
// at once, and needs them, for while one warp waits for a shared load or an exp another computes.
// So a row's threads may come as `splits` walkers of SPLIT threads each (1, 2 or 4 walkers; the
// launcher picks the fewest that give every multiprocessor 8 warps): walker w takes keys w,
// w + splits, ... of each tile (queries, in dK/dV), keeping its own running max, sum and output,
// and the walkers merge their results at the end, as two halves of a stream merge (split-K, in
// the terms of matrix products). A block keeps its QUERY_ROWS * SPLIT threads and so holds
// QUERY_ROWS / splits rows. The walkers read different rows of a tile at once; a tile row is
// padded by SPLIT chunks so that those rows start in different banks (Split::stride).
//
// Masks: causal (key j visible to query i when j <= i + K - Q) and valid lengths (j < lens[b, i]);
// a row with no visible key gets a zero output and lse = +inf, so that backward's exp(s - lse) is
// 0 rather than NaN.
//
// Dropout on the weights (training): out = (M * P) V, M the scaled mask (see Dropout). The running
// sum l adds every weight (the softmax's denominator is not dropped), the running output only the
// kept ones; backward multiplies p by M where it meets dO (dV) and dp = dO . v (dS), and D_i =
// dO_i . O_i needs no change. No mask is stored: each kernel hashes (seed, index) again.

#define QUERY_ROWS 64  // rows per block, SPLIT threads each
#define KEY_TILE 32    // keys per shared tile in the forward and dQ kernels
#define QUERY_TILE 16  // queries per shared tile in the dK/dV kernel

// The fast exponential in float32 (__expf: a multiply and the special-function unit's 2^x, two
// instructions where expf takes ten), as FlashAttention does: it runs once for every (query, key)
// pair in all three kernels, and its error, 2 + 1.2 |x| units in the last place, is small for
// the arguments here, s - m <= 0 in a row's useful range.
__device__ __forceinline__ float exponential(float v) { return __expf(v); }
__device__ __forceinline__ double exponential(double v) { return exp(v); }
__device__ __forceinline__ float logarithm(float v) { return logf(v); }
__device__ __forceinline__ double logarithm(double v) { return log(v); }

#include "random.cuh"

// Dropout on the weights: weight (b, h, i, j) is kept, times scale = 1 / (1 - p), when the random
// number of its index ((b H + h) Q + i) K + j in the whole (B, H, Q, K) weights is at least
// threshold = round(p 2^32): exactly what elementwise.cu's dropout (and the CPU's) keeps of those
// weights with this seed, so the stream drops what the plain path would. threshold 0: no dropout.
template <typename T>
struct Dropout {
    unsigned long long seed, threshold;
    T scale;

    __device__ __forceinline__ T factor(long long index) const {
        if (threshold == 0) return T(1);
        return uniform_bits(seed, (unsigned long long)index) >= threshold ? scale : T(0);
    }
};

template <typename T>
__device__ __forceinline__ T infinity();
template <>
__device__ __forceinline__ float infinity<float>() {
    return __int_as_float(0x7f800000);
}
template <>
__device__ __forceinline__ double infinity<double>() {
    return __longlong_as_double(0x7ff0000000000000LL);
}

// Threads per row of D numbers of type T: each thread holds at most 128 bytes of a row.
template <typename T, int D>
struct Split {
    static constexpr int value = D * int(sizeof(T)) > 256 ? 4 : 2;
    static constexpr int part = D / value;                 // numbers a thread holds of each row
    static constexpr int chunk = 16 / int(sizeof(T));      // numbers per 16-byte chunk
    static_assert(part % chunk == 0, "each thread holds whole chunks");
    // numbers per row of a shared tile: D and a pad of SPLIT chunks, so that row r + 1 starts
    // SPLIT chunks (banks) after row r, and the walkers of a row, reading rows r, r + 1, ... at
    // once, read different banks (D * sizeof(T) is a multiple of the 128 bytes of a bank row)
    static constexpr int stride = D + value * chunk;
};

// The row column of the c-th number that thread `part` of a row holds: chunk j of the thread's
// numbers is chunk j * SPLIT + part of the row.
template <typename T, int D>
__device__ __forceinline__ int held_column(int part, int c) {
    constexpr int SPLIT = Split<T, D>::value, CHUNK = Split<T, D>::chunk;
    return (c / CHUNK * SPLIT + part) * CHUNK + c % CHUNK;
}

// The thread's part of a . row, a the numbers it holds of some row, `row` a whole row of D
// (a shared tile's): four interleaved partial sums, four independent chains of multiply-adds
// instead of one, so the GPU overlaps them (a single chain waits for each add).
template <typename T, int D>
__device__ __forceinline__ T dot_part(const T* a, const T* row, int part) {
    constexpr int PART = Split<T, D>::part;
    static_assert(PART % 4 == 0, "parts of a multiple of 4");
    T sums[4] = {T(0), T(0), T(0), T(0)};
    _Pragma("unroll") for (int c = 0; c < PART; ++c) sums[c % 4] += a[c] * row[held_column<T, D>(part, c)];
    return (sums[0] + sums[1]) + (sums[2] + sums[3]);
}

// The whole of a dot product from the SPLIT threads' parts, in every one of them: a butterfly
// of register shuffles with the neighbours lane ^ 1 (and lane ^ 2). Each lane adds the same two
// numbers in its own order, and a + b = b + a exactly, so all lanes get the very same sum.
template <int SPLIT, typename T>
__device__ __forceinline__ T join_parts(T part_sum) {
    _Pragma("unroll") for (int lane = 1; lane < SPLIT; lane *= 2) {
        part_sum += __shfl_xor_sync(0xffffffffu, part_sum, lane);
    }
    return part_sum;
}

// The sum of `value` over the `splits` walkers of a row (lanes SPLIT apart, see the top): the
// same butterfly as join_parts, one level up, so every walker ends with the same sum.
template <int SPLIT, typename T>
__device__ __forceinline__ T join_walkers(T value, int splits) {
    for (int lane = SPLIT; lane < SPLIT * splits; lane *= 2) value += __shfl_xor_sync(0xffffffffu, value, lane);
    return value;
}

// Where the walkers of a row stop in a tile of which `count` keys are visited: walker w takes keys
// w, w + splits, ... below `count` rounded up to whole rounds of splits, so that every walker makes
// the same number of steps, and so of shuffles (a key past `count` is outside every row's keys).
__device__ __forceinline__ int whole_rounds(int count, int splits) { return (count + splits - 1) / splits * splits; }

// The shapes of one call: q (B, H, Q, d), k and v (B, G, K, d), query head h reads key/value
// head h / (H / G).
struct Shapes {
    long long B, H, G, Q, K, d;
};

// A relative bias, added to every score: table (H, Q + K - 1), whose column j - i + Q - 1 holds
// the bias of query i and key j in head h (a "scores" encoding's relative_bias), or none (null).
// window >= 0: keys farther than `window` from a query, at a distance j - i + shift (shift the
// key positions' offset less the queries'), have -inf in the table: the kernels skip them, and
// the blocks of keys that lie wholly beyond it; -1: no window.
template <typename T>
struct Bias {
    const T* table;
    long long shift, window;

    __device__ __forceinline__ T at(const Shapes& s, long long h, long long i, long long j) const {
        return table == nullptr ? T(0) : table[h * (s.Q + s.K - 1) + (j - i + s.Q - 1)];
    }
};

// Where the dQ kernel leaves the gradient of a learned bias table (T5's), or nulls: dL/dtable[h, c]
// sums ds_ij = dL/ds_ij over the (i, j) of column c = j - i + Q - 1, the batch included. Each
// block puts each key tile's ds (QUERY_ROWS x KEY_TILE) in its own part of `scratch`, then sums
// the tile's diagonals, one thread per diagonal, row by row, into its own row of `partial`, one
// number per t = j - (i - first_i) + QUERY_ROWS - 1 (K + QUERY_ROWS - 1 of them); the kernel
// attention_bias_grad then adds the blocks' rows up per column. No atomics: the same sums in
// the same order on every run.
template <typename T>
struct BiasGrad {
    T* scratch;
    T* partial;
};

// The keys query i of batch b may see: first .. end - 1 (none when end == first).
struct KeyRange {
    long long first, end;
};

__device__ __forceinline__ KeyRange visible_keys(const Shapes& s, const long long* lens, int causal, long long shift,
                                                 long long window, long long b, long long i) {
    long long first = 0, end = s.K;
    if (causal) end = min(end, i + (s.K - s.Q) + 1);
    if (lens != nullptr) end = min(end, lens[b * s.Q + i]);
    if (window >= 0) {
        first = max(first, i - shift - window);
        end = min(end, i - shift + window + 1);
    }
    return KeyRange{first, max(end, first)};
}

// The first key any of the queries first_query .. of a block may see: the lowest row's first.
__device__ __forceinline__ long long first_key_of_block(long long first_query, long long shift, long long window) {
    return window >= 0 ? max(0LL, first_query - shift - window) : 0LL;
}

// The largest of `value` over the block's THREADS threads, by a tree in shared memory (halving
// the active threads each step, a barrier between steps): how many key tiles the block must visit.
template <int THREADS = QUERY_ROWS>
__device__ long long block_max(long long value, long long* shared) {
    shared[threadIdx.x] = value;
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) shared[threadIdx.x] = max(shared[threadIdx.x], shared[threadIdx.x + half]);
        __syncthreads();
    }
    long long result = shared[0];
    __syncthreads();
    return result;
}

// Copies rows [first, first + count) of a (rows, d) matrix into a (count, D) tile (rows padded to
// Split::stride), zeros past `rows` and past d: each of the block's THREADS threads takes every
// THREADS-th element.
template <typename T, int D, int THREADS = QUERY_ROWS>
__device__ __forceinline__ void load_tile(T (*tile)[Split<T, D>::stride], const T* matrix, long long first, int count,
                                          long long rows, long long d) {
    for (int e = threadIdx.x; e < count * D; e += THREADS) {
        const int r = e / D, c = e % D;
        tile[r][c] = (first + r < rows && c < d) ? matrix[(first + r) * d + c] : T(0);
    }
}

// The query row this thread owns: one block per (batch, head, tile of QUERY_ROWS / splits queries).
struct QueryRow {
    long long b, h, kv, i, row;  // batch; head; its key/value head in (B, G); the query; its row of (B, H, Q)
    long long first_i;           // the block's first query
    long long tile;              // the block's tile of queries among all (B, H, tiles), in order
    int rows;                    // queries per tile: QUERY_ROWS / splits
    int walker;                  // which of the row's `splits` walkers this thread is in
    bool active;                 // i < Q: a thread past the last query still helps load the tiles
};

// `split` threads per walker, `splits` walkers per row: threads split splits t .. split splits
// (t + 1) - 1 share query row t of the block, walker w the `split` of them from split (splits t + w).
// The last tile of queries comes first: under a causal mask it sees the most keys, and a GPU that
// starts the longest blocks first finishes the grid with fewer of its cores idle (the
// longest-processing-time-first rule of scheduling jobs of unequal length).
__device__ __forceinline__ QueryRow query_row(const Shapes& s, int split, int splits) {
    const int rows = QUERY_ROWS / splits;
    const long long tiles = (s.Q + rows - 1) / rows;
    const long long bh = blockIdx.x / tiles, b = bh / s.H, h = bh % s.H, tile = tiles - 1 - blockIdx.x % tiles;
    const long long first_i = tile * rows, i = first_i + threadIdx.x / (split * splits);
    const int walker = threadIdx.x / split % splits;
    const long long kv = b * s.G + h / (s.H / s.G);
    return QueryRow{b, h, kv, i, bh * s.Q + i, first_i, bh * tiles + tile, rows, walker, i < s.Q};
}

// The numbers thread `part` holds of row `row` of a (rows, d) matrix, times `scale`: zeros past d,
// and all zeros for a thread that has no row (active false).
template <typename T, int D>
__device__ __forceinline__ void load_part(T (&into)[Split<T, D>::part], const T* matrix, long long row, long long d,
                                          int part, bool active, T scale = T(1)) {
    _Pragma("unroll") for (int c = 0; c < Split<T, D>::part; ++c) {
        const int column = held_column<T, D>(part, c);
        into[c] = active && column < d ? matrix[row * d + column] * scale : T(0);
    }
}

// Writes the numbers thread `part` holds back to row `row`, times `scale`. Unrolled, with a test
// per column, not a loop to the run-time d: a register array indexed by a run-time count would
// live in local memory for the whole kernel.
template <typename T, int D>
__device__ __forceinline__ void store_part(T* matrix, const T (&from)[Split<T, D>::part], long long row, long long d,
                                           int part, T scale = T(1)) {
    _Pragma("unroll") for (int c = 0; c < Split<T, D>::part; ++c) {
        const int column = held_column<T, D>(part, c);
        if (column < d) matrix[row * d + column] = from[c] * scale;
    }
}

// SPLIT threads per query row, as in the backward kernels: each holds its part of q_i and of the
// running output o, the parts of each score joined by shuffles, so all keep the same m and l.
// Every lane walks the keys of the block's longest row (each reaches every shuffle); a key
// beyond a thread's own row changes nothing. With splits > 1 each walker keeps its own m, l and o
// over its share of the keys, and the walkers merge them at the end.
template <typename T, int D>
__device__ void attention_forward(const T* q, const T* k, const T* v, const long long* lens, Bias<T> bias,
                                  Dropout<T> dropout, T* out, T* lse, Shapes s, T scale, int causal, int splits) {
    constexpr int SPLIT = Split<T, D>::value, PART = Split<T, D>::part, THREADS = QUERY_ROWS * SPLIT;
    __shared__ T k_tile[KEY_TILE][Split<T, D>::stride];
    __shared__ T v_tile[KEY_TILE][Split<T, D>::stride];
    __shared__ long long limits[THREADS];
    const QueryRow r = query_row(s, SPLIT, splits);
    const long long kv = r.kv, row = r.row;
    const bool active = r.active;
    const int part = threadIdx.x % SPLIT;

    T qr[PART], o[PART];
    load_part<T, D>(qr, q, row, s.d, part, active, scale);
    _Pragma("unroll") for (int c = 0; c < PART; ++c) o[c] = T(0);
    const KeyRange keys = active ? visible_keys(s, lens, causal, bias.shift, bias.window, r.b, r.i) : KeyRange{0, 0};
    const long long block_visible = block_max<THREADS>(keys.end, limits);
    T m = -infinity<T>(), l = T(0);
    for (long long j0 = first_key_of_block(r.first_i, bias.shift, bias.window); j0 < block_visible; j0 += KEY_TILE) {
        __syncthreads();  // everyone is done with the previous tile
        load_tile<T, D, THREADS>(k_tile, k + kv * s.K * s.d, j0, KEY_TILE, s.K, s.d);
        load_tile<T, D, THREADS>(v_tile, v + kv * s.K * s.d, j0, KEY_TILE, s.K, s.d);
        __syncthreads();
        const int count = int(min((long long)KEY_TILE, block_visible - j0));  // keys of this tile visited
        for (int jj = r.walker; jj < whole_rounds(count, splits); jj += splits) {
            const long long j = j0 + jj;
            const T score = join_parts<SPLIT>(dot_part<T, D>(qr, k_tile[jj], part));  // the whole score q . k
            // (after the shuffles: the other parts need this one)
            if (j < keys.first || j >= keys.end) continue;
            const T biased = score + bias.at(s, r.h, r.i, j);
            if (biased == -infinity<T>()) continue;  // the bias says "may not attend": exp(-inf - -inf) is no 0
            if (biased > m) {  // a new max: what was summed so far shrinks by exp(m - biased)
                const T rescale = exponential(m - biased);
                l *= rescale;
                _Pragma("unroll") for (int c = 0; c < PART; ++c) o[c] *= rescale;
                m = biased;
            }
            const T p = exponential(biased - m);
            l += p;
            const T kept = p * dropout.factor(row * s.K + j);
            _Pragma("unroll") for (int c = 0; c < PART; ++c) o[c] += kept * v_tile[jj][held_column<T, D>(part, c)];
        }
    }
    // the walkers' streams merge, each shrunk to the larger max: m = max(m_a, m_b),
    // l = l_a exp(m_a - m) + l_b exp(m_b - m), o likewise (a walker that saw no key adds nothing)
    for (int lane = SPLIT; lane < SPLIT * splits; lane *= 2) {
        const T m_other = __shfl_xor_sync(0xffffffffu, m, lane), both = max(m, m_other);
        const T mine = m == -infinity<T>() ? T(0) : exponential(m - both);
        const T theirs = m_other == -infinity<T>() ? T(0) : exponential(m_other - both);
        l = l * mine + __shfl_xor_sync(0xffffffffu, l, lane) * theirs;
        _Pragma("unroll") for (int c = 0; c < PART; ++c) {
            o[c] = o[c] * mine + __shfl_xor_sync(0xffffffffu, o[c], lane) * theirs;
        }
        m = both;
    }
    if (!active || r.walker != 0) return;
    store_part<T, D>(out, o, row, s.d, part, l > T(0) ? T(1) / l : T(0));  // no visible key: output 0
    if (part == 0) lse[row] = l > T(0) ? m + logarithm(l) : infinity<T>();
}

// dQ_i = scale sum_j p_ij (dp_ij - D_i) k_j, with p_ij = exp(s_ij - lse_i), dp_ij = dO_i . v_j,
// D_i = dO_i . O_i (= sum_j p_ij dp_ij), which this kernel computes first and writes to `delta`
// for the dK/dV kernel that runs after it. SPLIT threads per query row (three whole rows a
// thread would spill): each holds its part of q_i, dO_i and dQ_i, and shuffles with the others
// join the dot products. So that every lane reaches every shuffle, all threads walk the keys the
// block's longest row sees, and a key beyond a thread's own row adds ds = 0. With splits > 1 each
// walker sums over its share of the keys, and the walkers add their sums up at the end.
template <typename T, int D>
__device__ void attention_backward_dq(const T* q, const T* k, const T* v, const long long* lens, Bias<T> bias,
                                      Dropout<T> dropout, const T* lse, const T* grad_out, const T* out, T* delta,
                                      T* dq, BiasGrad<T> bias_grad, Shapes s, T scale, int causal, int splits) {
    constexpr int SPLIT = Split<T, D>::value, PART = Split<T, D>::part, THREADS = QUERY_ROWS * SPLIT;
    __shared__ T k_tile[KEY_TILE][Split<T, D>::stride];
    __shared__ T v_tile[KEY_TILE][Split<T, D>::stride];
    __shared__ long long limits[THREADS];
    const QueryRow r = query_row(s, SPLIT, splits);
    const long long kv = r.kv, row = r.row;
    const bool active = r.active;
    const int part = threadIdx.x % SPLIT;

    T qr[PART], dor[PART], acc[PART];
    load_part<T, D>(qr, q, row, s.d, part, active, scale);
    load_part<T, D>(dor, grad_out, row, s.d, part, active);
    load_part<T, D>(acc, out, row, s.d, part, active);  // O_i's part, for D_i (acc's registers, for now)
    T delta_part = T(0);
    _Pragma("unroll") for (int c = 0; c < PART; ++c) {
        delta_part += dor[c] * acc[c];
        acc[c] = T(0);
    }
    const T row_delta = join_parts<SPLIT>(delta_part), row_lse = active ? lse[row] : infinity<T>();
    if (active && part == 0 && r.walker == 0) delta[row] = row_delta;
    const KeyRange keys = active ? visible_keys(s, lens, causal, bias.shift, bias.window, r.b, r.i) : KeyRange{0, 0};
    const long long block_visible = block_max<THREADS>(keys.end, limits);
    // the learned bias's gradient, where asked for (see BiasGrad): this block's tile of ds and row
    // of partial sums, the row zeroed first (tiles the block skips add nothing to it)
    const long long width = s.K + r.rows - 1, local = r.i - r.first_i;
    T* const ds_tile = bias_grad.partial ? bias_grad.scratch + r.tile * (r.rows * KEY_TILE) : nullptr;
    T* const partial = bias_grad.partial ? bias_grad.partial + r.tile * width : nullptr;
    if (partial != nullptr) {
        for (long long t = threadIdx.x; t < width; t += THREADS) partial[t] = T(0);
    }
    for (long long j0 = first_key_of_block(r.first_i, bias.shift, bias.window); j0 < block_visible; j0 += KEY_TILE) {
        __syncthreads();
        load_tile<T, D, THREADS>(k_tile, k + kv * s.K * s.d, j0, KEY_TILE, s.K, s.d);
        load_tile<T, D, THREADS>(v_tile, v + kv * s.K * s.d, j0, KEY_TILE, s.K, s.d);
        __syncthreads();
        const int count = int(min((long long)KEY_TILE, block_visible - j0));  // keys of this tile visited
        for (int jj = r.walker; jj < whole_rounds(count, splits); jj += splits) {
            const T score = join_parts<SPLIT>(dot_part<T, D>(qr, k_tile[jj], part));
            const T dp = join_parts<SPLIT>(dot_part<T, D>(dor, v_tile[jj], part));
            const long long j = j0 + jj;
            const bool sees = j >= keys.first && j < keys.end;  // (false past the count: j >= block_visible)
            const T ds = sees ? exponential(score + bias.at(s, r.h, r.i, j) - row_lse) *
                                    (dp * dropout.factor(row * s.K + j) - row_delta)
                              : T(0);
            _Pragma("unroll") for (int c = 0; c < PART; ++c) acc[c] += ds * k_tile[jj][held_column<T, D>(part, c)];
            if (ds_tile != nullptr && part == 0 && jj < count) ds_tile[local * KEY_TILE + jj] = ds;
        }
        if (partial != nullptr) {  // (the same for the whole block)
            if (part == 0 && r.walker == 0) {
                for (int jj = count; jj < KEY_TILE; ++jj) ds_tile[local * KEY_TILE + jj] = T(0);
            }
            __syncthreads();  // the tile's ds written
            // diagonal u of the tile holds the cells (row, jj = u + row - (rows - 1)): t = j0 + u
            const int rows = r.rows;
            for (int u = threadIdx.x; u < rows + KEY_TILE - 1; u += THREADS) {
                T sum = T(0);
                for (int row_in = max(0, rows - 1 - u); row_in < min(rows, rows + KEY_TILE - 1 - u); ++row_in) {
                    sum += ds_tile[row_in * KEY_TILE + (u + row_in - (rows - 1))];
                }
                if (j0 + u < width) partial[j0 + u] += sum;  // (past the end: keys past K, all 0)
            }
        }
    }
    _Pragma("unroll") for (int c = 0; c < PART; ++c) acc[c] = join_walkers<SPLIT>(acc[c], splits);
    if (!active || r.walker != 0) return;
    store_part<T, D>(dq, acc, row, s.d, part, scale);
}

// row[column] of a shared tile whose row the dot products just read: a float as it is (the
// compiler may keep it from then), a double read again from shared memory. The dK/dV kernel
// holds four parts of rows (128 bytes each, see the top); a double takes two registers, and
// keeping the 32 doubles of q_i and dO_i that the dot products loaded until the updates needs
// more than a thread's 255 registers (NVRTC 13.0 spills them to local memory for an H100).
template <typename T>
__device__ __forceinline__ T read_again(const T* row, int column) {
    if constexpr (sizeof(T) == 8) return ((const volatile T*)row)[column];
    return row[column];
}

// dV_j = sum_i p_ij dO_i,  dK_j = scale sum_i p_ij (dp_ij - D_i) q_i, over the queries i of every
// head of j's group that see key j. Threads SPLIT t .. SPLIT t + SPLIT - 1 own key row t of the
// block (with one walker), each its part of the columns: each computes its part of q_i . k_j and
// dO_i . v_j, and shuffles with the others give all of them the whole. Every thread runs every step, so that
// the shuffles find their partners: a row that has no key, or whose key query i does not see,
// adds p = 0. With splits > 1 (QUERY_ROWS / splits keys a block) walker w of a key row takes
// queries w, w + splits, ... of each tile, and the walkers add their sums up at the end.
template <typename T, int D>
__device__ void attention_backward_dkv(const T* q, const T* k, const T* v, const long long* lens, Bias<T> bias,
                                       Dropout<T> dropout, const T* lse, const T* grad_out, const T* delta, T* dk,
                                       T* dv, Shapes s, T scale, int causal, int splits) {
    constexpr int SPLIT = Split<T, D>::value, PART = Split<T, D>::part, THREADS = QUERY_ROWS * SPLIT;
    static_assert(QUERY_TILE % 4 == 0, "every walker takes as many queries of a tile (splits <= 4)");
    __shared__ T q_tile[QUERY_TILE][Split<T, D>::stride];
    __shared__ T do_tile[QUERY_TILE][Split<T, D>::stride];
    __shared__ T lse_tile[QUERY_TILE];
    __shared__ T delta_tile[QUERY_TILE];
    __shared__ long long first_tile[QUERY_TILE], end_tile[QUERY_TILE];  // each query's visible keys
    const int rows = QUERY_ROWS / splits, walker = threadIdx.x / SPLIT % splits;
    const long long tiles = (s.K + rows - 1) / rows;
    const long long bg = blockIdx.x / tiles, b = bg / s.G, group = bg % s.G, r = s.H / s.G;
    // (in order: the first keys, which the most queries see under a causal mask, come first)
    const long long j = (blockIdx.x % tiles) * rows + threadIdx.x / (SPLIT * splits);
    const int part = threadIdx.x % SPLIT;
    const bool active = j < s.K;
    const long long key_row = bg * s.K + j;

    T kr[PART], vr[PART], dk_acc[PART], dv_acc[PART];
    load_part<T, D>(kr, k, key_row, s.d, part, active);
    load_part<T, D>(vr, v, key_row, s.d, part, active);
    _Pragma("unroll") for (int c = 0; c < PART; ++c) dk_acc[c] = dv_acc[c] = T(0);
    // the queries that can see any of the block's keys: causal rows above the first key see none
    // of them, and a window hides them from the rows farther than it from every key
    const long long first_key = (blockIdx.x % tiles) * rows, last_key = first_key + rows - 1;
    long long first_query = causal ? max(0LL, first_key - (s.K - s.Q)) : 0, end_query = s.Q;
    if (bias.window >= 0) {
        first_query = max(first_query, first_key + bias.shift - bias.window);
        end_query = min(end_query, last_key + bias.shift + bias.window + 1);
    }
    for (long long h = group * r; h < (group + 1) * r; ++h) {
        const long long base = (b * s.H + h) * s.Q;  // row of (b, h, query 0)
        for (long long i0 = first_query; i0 < end_query; i0 += QUERY_TILE) {
            __syncthreads();
            load_tile<T, D, THREADS>(q_tile, q + base * s.d, i0, QUERY_TILE, s.Q, s.d);
            load_tile<T, D, THREADS>(do_tile, grad_out + base * s.d, i0, QUERY_TILE, s.Q, s.d);
            if (threadIdx.x < QUERY_TILE) {
                const long long i = i0 + threadIdx.x;
                const bool in = i < s.Q;
                lse_tile[threadIdx.x] = in ? lse[base + i] : infinity<T>();
                delta_tile[threadIdx.x] = in ? delta[base + i] : T(0);
                const KeyRange keys =
                    in ? visible_keys(s, lens, causal, bias.shift, bias.window, b, i) : KeyRange{0, 0};
                first_tile[threadIdx.x] = keys.first;
                end_tile[threadIdx.x] = keys.end;
            }
            __syncthreads();
            for (int ii = walker; ii < QUERY_TILE; ii += splits) {
                const T score = join_parts<SPLIT>(dot_part<T, D>(kr, q_tile[ii], part));
                const T dp = join_parts<SPLIT>(dot_part<T, D>(vr, do_tile[ii], part));
                const bool sees = active && j >= first_tile[ii] && j < end_tile[ii];
                const T p = sees ? exponential(score * scale + bias.at(s, h, i0 + ii, j) - lse_tile[ii]) : T(0);
                const T kept = sees ? dropout.factor((base + i0 + ii) * s.K + j) : T(0);  // M_ij
                const T ds = p * (dp * kept - delta_tile[ii]) * scale;
                _Pragma("unroll") for (int c = 0; c < PART; ++c) {
                    const int column = held_column<T, D>(part, c);
                    dv_acc[c] += p * kept * read_again(do_tile[ii], column);
                    dk_acc[c] += ds * read_again(q_tile[ii], column);
                }
            }
        }
    }
    _Pragma("unroll") for (int c = 0; c < PART; ++c) {
        dk_acc[c] = join_walkers<SPLIT>(dk_acc[c], splits);
        dv_acc[c] = join_walkers<SPLIT>(dv_acc[c], splits);
    }
    if (!active || walker != 0) return;
    store_part<T, D>(dk, dk_acc, key_row, s.d, part);
    store_part<T, D>(dv, dv_acc, key_row, s.d, part);
}

// dtable[h, c] = the sum over the batch and the query tiles of the dQ kernel's partial sums of
// column c = j - i + Q - 1 (see BiasGrad): one thread per (h, c), in a fixed order, in double.
// `rows`: queries per tile of the dQ kernel (QUERY_ROWS / splits).
template <typename T>
__device__ void attention_bias_grad(const T* partial, T* dtable, Shapes s, long long rows) {
    const long long width = s.K + rows - 1, columns = s.Q + s.K - 1;
    const long long tiles = (s.Q + rows - 1) / rows;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < s.H * columns;
         e += (long long)gridDim.x * blockDim.x) {
        const long long h = e / columns, c = e % columns;
        double sum = 0.0;
        for (long long b = 0; b < s.B; ++b) {
            for (long long tile = 0; tile < tiles; ++tile) {
                // the cells (i, j) of column c in query tile `tile`: t = j - (i - first_i) + rows - 1
                const long long t = c - (s.Q - 1) + tile * rows + rows - 1;
                if (t >= 0 && t < width) sum += double(partial[((b * s.H + h) * tiles + tile) * width + t]);
            }
        }
        dtable[e] = T(sum);
    }
}

// The forward keeps 16 warps on a multiprocessor (its 65,536 registers hold 512 threads of 128):
// its block's threads, and how many such blocks the compiler must fit (so at most 128 registers).
#define FORWARD_THREADS(T, D) (QUERY_ROWS * Split<T, D>::value)
#define FORWARD_BLOCKS(T, D) (512 / FORWARD_THREADS(T, D))

// The kernels, by row size D and dtype: attention_forward_d64_float32 and so on. The launcher
// picks the smallest D at least the head's d.
#define ATTENTION_KERNELS(T, D, DTYPE)                                                                              \
    extern "C" __global__ void __launch_bounds__(FORWARD_THREADS(T, D), FORWARD_BLOCKS(T, D))                       \
        attention_forward_d##D##_##DTYPE(                                                                           \
        const T* q, const T* k, const T* v, const long long* lens, const T* table, T* out, T* lse, long long B,     \
        long long H, long long G, long long Q, long long K, long long d, T scale, int causal, int has_lens,         \
        int has_table, long long shift, long long window, unsigned long long seed,                                  \
        const unsigned long long* seed_at, unsigned long long threshold, T drop_scale, int splits) {                \
        attention_forward<T, D>(q, k, v, has_lens ? lens : nullptr,                                                 \
                                Bias<T>{has_table ? table : nullptr, shift, window},                                \
                                Dropout<T>{read_seed(seed, seed_at), threshold, drop_scale}, out, lse,              \
                                Shapes{B, H, G, Q, K, d}, scale, causal, splits);                                   \
    }                                                                                                               \
    extern "C" __global__ void attention_backward_dq_d##D##_##DTYPE(                                                \
        const T* q, const T* k, const T* v, const long long* lens, const T* table, const T* lse, const T* grad_out, \
        const T* out, T* delta, T* dq, T* scratch, T* partial, long long B, long long H, long long G, long long Q,  \
        long long K, long long d, T scale, int causal, int has_lens, int has_table, long long shift,                \
        long long window, unsigned long long seed, const unsigned long long* seed_at, unsigned long long threshold, \
        T drop_scale, int table_grad, int splits) {                                                                 \
        attention_backward_dq<T, D>(q, k, v, has_lens ? lens : nullptr,                                             \
                                    Bias<T>{has_table ? table : nullptr, shift, window},                            \
                                    Dropout<T>{read_seed(seed, seed_at), threshold, drop_scale}, lse, grad_out,     \
                                    out, delta, dq, BiasGrad<T>{scratch, table_grad ? partial : nullptr},           \
                                    Shapes{B, H, G, Q, K, d}, scale, causal, splits);                               \
    }                                                                                                               \
    extern "C" __global__ void attention_backward_dkv_d##D##_##DTYPE(                                               \
        const T* q, const T* k, const T* v, const long long* lens, const T* table, const T* lse, const T* grad_out, \
        const T* delta, T* dk, T* dv, long long B, long long H, long long G, long long Q, long long K, long long d, \
        T scale, int causal, int has_lens, int has_table, long long shift, long long window,                        \
        unsigned long long seed, const unsigned long long* seed_at, unsigned long long threshold, T drop_scale,     \
        int splits) {                                                                                               \
        attention_backward_dkv<T, D>(q, k, v, has_lens ? lens : nullptr,                                            \
                                     Bias<T>{has_table ? table : nullptr, shift, window},                           \
                                     Dropout<T>{read_seed(seed, seed_at), threshold, drop_scale}, lse, grad_out,    \
                                     delta, dk, dv, Shapes{B, H, G, Q, K, d}, scale, causal, splits);               \
    }

extern "C" __global__ void attention_bias_grad_float32(const float* partial, float* dtable, long long B, long long H,
                                                       long long Q, long long K, long long rows) {
    attention_bias_grad<float>(partial, dtable, Shapes{B, H, 1, Q, K, 0}, rows);
}
extern "C" __global__ void attention_bias_grad_float64(const double* partial, double* dtable, long long B,
                                                       long long H, long long Q, long long K, long long rows) {
    attention_bias_grad<double>(partial, dtable, Shapes{B, H, 1, Q, K, 0}, rows);
}

ATTENTION_KERNELS(float, 32, float32)
ATTENTION_KERNELS(float, 64, float32)
ATTENTION_KERNELS(float, 128, float32)
ATTENTION_KERNELS(double, 32, float64)
ATTENTION_KERNELS(double, 64, float64)
