// The counter-based random numbers of dropout, shared by elementwise.cu (dropout on any tensor)
// and attention.cu (dropout on the attention weights inside the stream): number i of seed s is a
// hash of (s, i), SplitMix64's i-th output (Steele et al., 2014), the same as the CPU kernels'
// (minitensor/core/kernels/fused.py), so no generator state is read or written, backward makes
// the same mask again from the seed, and a mask drawn with seed s is the same on both devices.
// (The launcher pastes this file where a source includes it: NVRTC is given one text.)

__device__ __forceinline__ unsigned long long uniform_bits(unsigned long long seed, unsigned long long i) {
    unsigned long long z = seed + (i + 1) * 0x9E3779B97F4A7C15ULL;  // wraps around mod 2^64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z = z ^ (z >> 31);
    return z >> 32;  // the top 32 bits: uniform over [0, 2^32)
}
