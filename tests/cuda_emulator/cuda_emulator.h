// A CUDA C++ emulator for the CPU: just enough of CUDA to run minitensor's kernels
// (minitensor/core/kernels/cuda/*.cu) unchanged on a machine without a GPU, for the tests.
//
// Every CUDA thread of a block is a std::thread. __syncthreads() is a barrier over the block's
// threads and __syncwarp() one over the warp's; the warp shuffles exchange values through a
// 32-slot buffer between two barriers over the warp's threads, so a kernel whose lanes disagree
// about a shuffle deadlocks here as it misbehaves on a GPU (under ThreadSanitizer, a shuffle's
// barriers order no memory: see `unordered`). A thread that returns drops out of its barriers (as
// an exited thread does on a GPU), and a shuffle that reads its lane, or a lane a partial warp
// does not have, gets NaN (see `no_lane`). Blocks run one after another; in the race check's build
// (CUDA_EMULATOR_WAVE_THREADS defined) as many blocks as hold that many threads run at once, as a
// GPU runs them, so that ThreadSanitizer sees two blocks' accesses to one word unordered. Each
// block has shared memory of its own: the emulator's build rewrites every `__shared__ T name[N];`
// into `auto& name = emulator::shared<T[N]>(...)`, memory the block's first thread to reach the
// declaration allocates filled with 0xFF bytes (NaN for a float or a double, -1 for an integer),
// so that a kernel that reads shared memory it did not write in this block gets NaN, as a GPU
// gives it whatever an earlier kernel left there, instead of zeros or the previous block's values.
// Device intrinsics are the C library's functions with CUDA's names.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

inline dim3 gridDim, blockDim;
inline thread_local dim3 threadIdx, blockIdx;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)  // a hint to the register allocator: nothing to emulate

namespace emulator {
using Barrier = std::barrier<>;

// A lane that has exited, or that a partial warp does not have, holds all bits set in its slot: a
// shuffle that reads it gets NaN (-1 for an integer), where a GPU gives an undefined value.
constexpr std::uint64_t no_lane = ~std::uint64_t(0);

struct Warp {
    explicit Warp(std::ptrdiff_t lanes) : barrier(lanes) {
        for (auto& slot : slots) slot.store(no_lane, std::memory_order_relaxed);
    }
    Barrier barrier;
    std::atomic<std::uint64_t> slots[32];
};

#ifdef __SANITIZE_THREAD__
extern "C" {
void AnnotateIgnoreReadsBegin(const char* file, int line);
void AnnotateIgnoreReadsEnd(const char* file, int line);
void AnnotateIgnoreWritesBegin(const char* file, int line);
void AnnotateIgnoreWritesEnd(const char* file, int line);
void AnnotateIgnoreSyncBegin(const char* file, int line);
void AnnotateIgnoreSyncEnd(const char* file, int line);
}
#endif

// A shuffle moves values, not memory order: on a GPU, __shfl_sync orders no lane's reads and
// writes of memory against another lane's (__syncwarp does: CUDA C++ Programming Guide,
// "Synchronization Functions"). So ThreadSanitizer is told to look away while a lane waits at a
// shuffle's barrier (neither the order that barrier gives nor its own bookkeeping counts), and
// lanes that pass a value through shared memory with only a shuffle between the write and the
// read are reported, as compute-sanitizer's racecheck reports them on a GPU.
template <typename Wait>
void unordered(Wait wait) {
#ifdef __SANITIZE_THREAD__
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
#endif
    wait();
#ifdef __SANITIZE_THREAD__
    AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
}

inline thread_local Barrier* block_barrier = nullptr;
inline thread_local Warp* warp = nullptr;

// The running block's shared memory, by the function (template arguments included) and name of
// each declaration.
struct SharedMemory {
    std::mutex lock;
    std::map<std::string, std::unique_ptr<unsigned char[]>> variables;
};
inline thread_local SharedMemory* block_shared = nullptr;

template <typename T>
T& shared(const char* function, const char* name) {
    std::lock_guard<std::mutex> hold(block_shared->lock);
    auto& bytes = block_shared->variables[std::string(function) + "::" + name];
    if (!bytes) {
        bytes.reset(new unsigned char[sizeof(T)]);  // aligned for any scalar type
        std::memset(bytes.get(), 0xFF, sizeof(T));
    }
    return *reinterpret_cast<T*>(bytes.get());
}

// What a block's threads share: their barrier, their warps' and their shared memory.
struct Block {
    explicit Block(unsigned threads) : barrier(threads) {
        for (unsigned first = 0; first < threads; first += 32)
            warps.push_back(std::make_unique<Warp>(std::min(32u, threads - first)));
    }
    Barrier barrier;
    SharedMemory memory;
    std::vector<std::unique_ptr<Warp>> warps;
};

// The threads that may run at once: one block's by default; under the race check, a wave of
// blocks. Blocks of one wave share no barrier, so the sanitizer reports what one block writes and
// another reads or writes in the same launch (a GPU runs blocks in any order, or together); the
// waves' joins order one wave after the next, so a grid larger than one wave is checked only
// block against block within each wave (the race check's cases fit one).
#ifndef CUDA_EMULATOR_WAVE_THREADS
#define CUDA_EMULATOR_WAVE_THREADS 1
#endif
constexpr unsigned wave_threads = CUDA_EMULATOR_WAVE_THREADS;

// Runs kernel(args...) on a grid of `grid` blocks of `block` threads (1-D, as the kernels use).
template <typename Kernel>
void launch(unsigned grid, unsigned block, Kernel kernel) {
    gridDim = dim3{grid, 1, 1};
    blockDim = dim3{block, 1, 1};
    unsigned wave = std::max(1u, wave_threads / block);
    for (unsigned first = 0; first < grid; first += wave) {
        unsigned last = std::min(grid, first + wave);
        std::vector<std::unique_ptr<Block>> blocks;
        for (unsigned b = first; b < last; ++b) blocks.push_back(std::make_unique<Block>(block));
        std::vector<std::thread> threads;
        threads.reserve((last - first) * block);
        for (unsigned b = first; b < last; ++b) {
            Block& mine = *blocks[b - first];
            for (unsigned t = 0; t < block; ++t) {
                threads.emplace_back([&, b, t] {
                    blockIdx = dim3{b, 1, 1};
                    threadIdx = dim3{t, 1, 1};
                    block_barrier = &mine.barrier;
                    block_shared = &mine.memory;
                    warp = mine.warps[t / 32].get();
                    kernel();
                    // an exited thread no longer holds anyone up, and has no value to shuffle
                    warp->slots[t % 32].store(no_lane, std::memory_order_relaxed);
                    emulator::unordered([] { warp->barrier.arrive_and_drop(); });
                    mine.barrier.arrive_and_drop();
                });
            }
        }
        for (auto& thread : threads) thread.join();
    }
}
}  // namespace emulator

inline void __syncthreads() { emulator::block_barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emulator::warp->barrier.arrive_and_wait(); }

template <typename T>
T __shfl_sync_from(T value, unsigned source_lane) {
    static_assert(sizeof(T) <= sizeof(std::uint64_t), "a shuffle moves at most 8 bytes");
    auto* w = emulator::warp;
    std::uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    // relaxed: the slots pass the values, and order nothing else (see unordered)
    w->slots[threadIdx.x % 32].store(bits, std::memory_order_relaxed);
    emulator::unordered([w] { w->barrier.arrive_and_wait(); });  // every lane has written
    bits = w->slots[source_lane % 32].load(std::memory_order_relaxed);
    // every lane has read before the next shuffle writes
    emulator::unordered([w] { w->barrier.arrive_and_wait(); });
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}

template <typename T>
T __shfl_xor_sync(unsigned, T value, int lane_mask) {
    return __shfl_sync_from(value, (threadIdx.x % 32) ^ lane_mask);
}

template <typename T>
T __shfl_sync(unsigned, T value, int source_lane) {
    return __shfl_sync_from(value, source_lane);
}

inline float __int_as_float(int bits) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// The GPU's fast exponential, here the C library's (more exact than the GPU's: the tests' float32
// tolerances cover the difference)
inline float __expf(float v) { return std::exp(v); }

inline double __longlong_as_double(long long bits) {
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
}

using std::erfc;
using std::max;
using std::min;
using std::exp;
using std::log;
using std::sqrt;
using std::isfinite;
