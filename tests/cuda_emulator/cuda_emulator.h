// A CUDA C++ emulator for the CPU: just enough of CUDA to run minitensor's kernels
// (minitensor/core/kernels/cuda/*.cu) unchanged on a machine without a GPU, for the tests.
//
// Every CUDA thread of a block is a fiber: its own stack and registers, all of a block's fibers
// taking turns on one OS thread, each running until it waits at a barrier or returns (a switch
// costs some microseconds, where starting and waking a std::thread per CUDA thread cost some
// hundred on a 2-core machine). __syncthreads() is a barrier over the block's threads and
// __syncwarp() one over the warp's; the warp shuffles exchange values through a 32-slot buffer
// between two barriers over the warp's threads, so a kernel whose lanes disagree about a shuffle,
// or whose threads wait at different barriers, stops here with "deadlock" where a GPU would hang
// or misbehave. A thread that returns drops out of its barriers (as an exited thread
// does on a GPU), and a shuffle that reads its lane, or a lane a partial warp does not have, gets
// NaN (see `no_lane`). Blocks run one after another.
//
// The race check's build (CUDA_EMULATOR_WAVE_THREADS defined, with ThreadSanitizer) runs every
// CUDA thread as a std::thread instead, the barriers std::barrier: the sanitizer follows threads,
// not fibers. There as many blocks as hold that many threads run at once, as a GPU runs them, so
// that ThreadSanitizer sees two blocks' accesses to one word unordered (and a shuffle's barriers
// order no memory: see `unordered`). Each
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

#ifndef CUDA_EMULATOR_WAVE_THREADS
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#endif

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
#ifdef CUDA_EMULATOR_WAVE_THREADS
using Barrier = std::barrier<>;
#else
// The fiber that runs, the scheduler's context it returns to, and a count of every arrival at a
// barrier and every return: a round of turns that adds none means no fiber can go on.
struct Fiber {
    ucontext_t context;
    char* stack = nullptr;
    bool done = false;
};
inline thread_local ucontext_t scheduler;
inline thread_local Fiber* running = nullptr;
inline thread_local std::uint64_t progress = 0;

// std::barrier's arrive_and_wait and arrive_and_drop for fibers: a fiber that arrives before the
// last yields its turn until the phase ends.
class Barrier {
  public:
    explicit Barrier(std::ptrdiff_t count) : expected_(count) {}
    void arrive_and_wait() {
        const std::uint64_t mine = phase_;
        ++arrived_;
        end_phase_if_all_arrived();
        while (phase_ == mine) swapcontext(&running->context, &scheduler);
    }
    void arrive_and_drop() {  // this phase and the next expect one fiber fewer
        --expected_;
        end_phase_if_all_arrived();
    }

  private:
    void end_phase_if_all_arrived() {
        ++progress;
        if (arrived_ >= expected_) {
            arrived_ = 0;
            ++phase_;
        }
    }
    std::ptrdiff_t expected_, arrived_ = 0;
    std::uint64_t phase_ = 0;
};
#endif

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

#ifdef CUDA_EMULATOR_WAVE_THREADS
// The race check: the threads that may run at once are a wave of blocks, each CUDA thread a
// std::thread. Blocks of one wave share no barrier, so the sanitizer reports what one block
// writes and another reads or writes in the same launch (a GPU runs blocks in any order, or
// together); the waves' joins order one wave after the next, so a grid larger than one wave is
// checked only block against block within each wave (the race check's cases fit one).
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
#else
// A fiber's stack, with an inaccessible page below it: a kernel that overflows it stops
// (SIGSEGV) instead of writing over another fiber's.
constexpr std::size_t fiber_stack_bytes = 256 * 1024;

inline char* new_fiber_stack() {
    const std::size_t page = std::size_t(sysconf(_SC_PAGESIZE));
#ifndef MAP_STACK  // Linux's hint that the memory is a stack; other systems go without it
#define MAP_STACK 0
#endif
    void* memory = mmap(nullptr, fiber_stack_bytes + page, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (memory == MAP_FAILED) {
        std::perror("cuda emulator: mmap of a fiber's stack");
        std::abort();
    }
    mprotect(memory, page, PROT_NONE);
    return static_cast<char*>(memory) + page;
}

// The kernel of the running launch, which every fiber of a block calls, then leaves its barriers.
inline thread_local void (*run_kernel)(const void*) = nullptr;
inline thread_local const void* kernel_arguments = nullptr;

inline void fiber_main() {
    run_kernel(kernel_arguments);
    // an exited thread no longer holds anyone up, and has no value to shuffle
    warp->slots[threadIdx.x % 32].store(no_lane, std::memory_order_relaxed);
    warp->barrier.arrive_and_drop();
    block_barrier->arrive_and_drop();
    running->done = true;
}  // back to the scheduler (uc_link)

// Runs kernel(args...) on a grid of `grid` blocks of `block` threads (1-D, as the kernels use):
// block after block, each block's threads as fibers taking turns until all have returned.
template <typename Kernel>
void launch(unsigned grid, unsigned block, Kernel kernel) {
    gridDim = dim3{grid, 1, 1};
    blockDim = dim3{block, 1, 1};
    static thread_local std::vector<Fiber> fibers;  // their stacks serve launch after launch
    while (fibers.size() < block) fibers.push_back(Fiber{{}, new_fiber_stack(), false});
    run_kernel = [](const void* k) { (*static_cast<const Kernel*>(k))(); };
    kernel_arguments = &kernel;
    for (unsigned b = 0; b < grid; ++b) {
        Block mine(block);
        blockIdx = dim3{b, 1, 1};
        block_barrier = &mine.barrier;
        block_shared = &mine.memory;
        for (unsigned t = 0; t < block; ++t) {
            Fiber& fiber = fibers[t];
            fiber.done = false;
            getcontext(&fiber.context);
            fiber.context.uc_stack.ss_sp = fiber.stack;
            fiber.context.uc_stack.ss_size = fiber_stack_bytes;
            fiber.context.uc_link = &scheduler;
            makecontext(&fiber.context, fiber_main, 0);
        }
        for (unsigned left = block; left > 0;) {
            const std::uint64_t before = progress;
            for (unsigned t = 0; t < block; ++t) {
                if (fibers[t].done) continue;
                running = &fibers[t];
                threadIdx = dim3{t, 1, 1};
                warp = mine.warps[t / 32].get();
                swapcontext(&scheduler, &fibers[t].context);
                if (fibers[t].done) --left;
            }
            if (left > 0 && progress == before) {  // every thread left waits, and none can arrive
                std::fprintf(stderr,
                             "cuda emulator: deadlock in block %u: %u of its %u threads wait at "
                             "a barrier (__syncthreads, __syncwarp or a shuffle) that the others "
                             "never reach\n",
                             b, left, block);
                std::abort();
            }
        }
    }
}
#endif
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
