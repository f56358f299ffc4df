// The counter-based random numbers of dropout, shared by elementwise.cu (dropout on any tensor)
// and attention.cu (dropout on the attention weights inside the stream): number i of seed s is a
// hash of (s, i), SplitMix64's i-th output (Steele et al., 2014), the same as the CPU kernels'
// (minitensor/core/kernels/fused.py), so no generator state is read or written, backward makes
// the same mask again from the seed, and a mask drawn with seed s is the same on both devices.
// (The launcher pastes this file where a source includes it: NVRTC is given one text.)

// SplitMix64's output for state x: its finaliser of x + the golden-ratio increment (wraps mod 2^64)
__device__ __forceinline__ unsigned long long splitmix64(unsigned long long x) {
    unsigned long long z = x + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ unsigned long long uniform_bits(unsigned long long seed, unsigned long long i) {
    return splitmix64(seed + i * 0x9E3779B97F4A7C15ULL) >> 32;  // the top 32 bits: uniform over [0, 2^32)
}

// A captured CUDA graph (minitensor.cuda.graph) replays each launch with the arguments it was
// captured with: a seed passed by value would drop the same elements at every replay. So there
// the launcher passes SEED_ON_DEVICE and the address of the seed, which the graph's owner
// rewrites before each replay (draw_seeds, elementwise.cu); elsewhere the seed itself, and the
// address of a word that is never read.
#define SEED_ON_DEVICE 0xFFFFFFFFFFFFFFFFULL  // no drawn seed: they are below 2^62

__device__ __forceinline__ unsigned long long read_seed(unsigned long long seed, const unsigned long long* seed_at) {
    return seed == SEED_ON_DEVICE ? *seed_at : seed;
}
