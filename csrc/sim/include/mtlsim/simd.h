// SIMD-group and quad-group functions, barriers and memory flags.
//
// Each collective blocks the calling GPU thread in the runtime until every
// live lane of its SIMD group has reached the same call site; the runtime then
// runs the operation once over all participating lanes. Lanes that took
// another branch are outside `mask`, which gives the GPU's active-lane
// semantics.
#pragma once

#include <type_traits>

#include "mtlsim/glue.h"
#include "mtlsim/math.h"

namespace mtlsim::simd {

constexpr uint32_t kAllLanes = 0xffffffffu;

inline bool active(uint32_t mask, uint32_t lane) { return (mask >> lane) & 1u; }

template <class Op, class In, class Out>
void run(const void* const* in, void* const* out, uint32_t mask) {
  Op::apply(reinterpret_cast<const In* const*>(in), reinterpret_cast<Out* const*>(out), mask);
}

template <class Op, class Out, class In>
Out collective(const In& in, const Site& site) {
  Out out;
  mtlsim_rt->collective(&run<Op, In, Out>, &in, &out, &site);
  return out;
}

// Reductions pair lane i with lane i + s for s = 16, 8, 4, 2, 1 over the lanes
// of a group (32 lanes, or 4 for quads), skipping inactive lanes.
template <class T, class F>
T reduce(const T* const* in, uint32_t mask, uint32_t first, uint32_t width, F combine) {
  T acc[kSimdWidth];
  uint32_t present = 0;
  for (uint32_t i = 0; i < width; ++i) {
    if (active(mask, first + i)) {
      acc[i] = *in[first + i];
      present |= 1u << i;
    }
  }
  for (uint32_t s = width / 2; s > 0; s /= 2) {
    for (uint32_t i = 0; i < s; ++i) {
      const bool a = (present >> i) & 1u, b = (present >> (i + s)) & 1u;
      if (a && b) {
        acc[i] = combine(acc[i], acc[i + s]);
      } else if (b) {
        acc[i] = acc[i + s];
        present |= 1u << i;
      }
    }
  }
  return acc[0];
}

template <uint32_t Width, class F>
struct Reduce {
  template <class T>
  static void apply(const T* const* in, T* const* out, uint32_t mask) {
    for (uint32_t first = 0; first < kSimdWidth; first += Width) {
      if (((mask >> first) & uint32_t((uint64_t(1) << Width) - 1)) == 0) continue;
      const T r = reduce(in, mask, first, Width, F{});
      for (uint32_t i = first; i < first + Width; ++i)
        if (active(mask, i)) *out[i] = r;
    }
  }
};

template <uint32_t Width, class F, bool Inclusive>
struct Prefix {
  template <class T>
  static void apply(const T* const* in, T* const* out, uint32_t mask) {
    for (uint32_t first = 0; first < kSimdWidth; first += Width) {
      bool started = false;
      T acc{};
      for (uint32_t i = first; i < first + Width; ++i) {
        if (!active(mask, i)) continue;
        const T x = *in[i];
        if (Inclusive) {
          acc = started ? F{}(acc, x) : x;
          *out[i] = acc;
        } else {
          *out[i] = started ? acc : F::template identity<T>();
          acc = started ? F{}(acc, x) : x;
        }
        started = true;
      }
    }
  }
};

struct Add {
  template <class T> T operator()(T a, T b) const { return a + b; }
  template <class T> static T identity() { return T(0); }
};
struct Mul {
  template <class T> T operator()(T a, T b) const { return a * b; }
  template <class T> static T identity() { return T(1); }
};
struct Max {
  template <class T> T operator()(T a, T b) const { return metal::max(a, b); }
};
struct Min {
  template <class T> T operator()(T a, T b) const { return metal::min(a, b); }
};
struct And {
  template <class T> T operator()(T a, T b) const { return a & b; }
};
struct Or {
  template <class T> T operator()(T a, T b) const { return a | b; }
};
struct Xor {
  template <class T> T operator()(T a, T b) const { return a ^ b; }
};

// A value and the lane argument of a shuffle.
template <class T>
struct Shuffle {
  T value;
  uint32_t arg;
};

// Where each lane reads from; an inactive or out-of-group source keeps the
// lane's own value, which is what the GPU does for the edges of shuffle_up/down.
enum class Source { Index, Up, Down, Xor, RotateUp, RotateDown };

template <uint32_t Width, Source S>
struct Permute {
  template <class T>
  static void apply(const Shuffle<T>* const* in, T* const* out, uint32_t mask) {
    for (uint32_t lane = 0; lane < kSimdWidth; ++lane) {
      if (!active(mask, lane)) continue;
      const uint32_t first = lane - lane % Width, pos = lane % Width, arg = in[lane]->arg;
      int64_t src = -1;  // -1: no source lane
      switch (S) {
        case Source::Index: src = arg < Width ? int64_t(arg) : -1; break;
        case Source::Up: src = pos >= arg ? int64_t(pos) - arg : -1; break;
        case Source::Down: src = pos + arg < Width ? int64_t(pos + arg) : -1; break;
        case Source::Xor: src = (pos ^ arg) < Width ? int64_t(pos ^ arg) : -1; break;
        case Source::RotateUp: src = (pos + Width - arg % Width) % Width; break;
        case Source::RotateDown: src = (pos + arg) % Width; break;
      }
      const bool ok = src >= 0 && active(mask, first + uint32_t(src));
      *out[lane] = ok ? in[first + uint32_t(src)]->value : in[lane]->value;
    }
  }
};

// shuffle_and_fill: lanes whose source falls off the edge take `fill` from the
// lane that many positions around the modulo window instead.
template <class T>
struct Fill {
  T value, fill;
  uint32_t delta, modulo;
};

template <bool Up>
struct ShuffleAndFill {
  template <class T>
  static void apply(const Fill<T>* const* in, T* const* out, uint32_t mask) {
    for (uint32_t lane = 0; lane < kSimdWidth; ++lane) {
      if (!active(mask, lane)) continue;
      const Fill<T>& me = *in[lane];
      const uint32_t m = me.modulo, first = lane - lane % m, pos = lane % m;
      const bool inside = Up ? pos >= me.delta : pos + me.delta < m;
      const uint32_t src = first + (Up ? (pos + m - me.delta) % m : (pos + me.delta) % m);
      if (!active(mask, src)) {
        *out[lane] = me.value;
      } else {
        *out[lane] = inside ? in[src]->value : in[src]->fill;
      }
    }
  }
};

// Predicates over the participating lanes of each group.
enum class Vote { Ballot, All, Any, IsFirst };

template <uint32_t Width, Vote V>
struct Votes {
  template <class Out>
  static void apply(const bool* const* in, Out* const* out, uint32_t mask) {
    for (uint32_t first = 0; first < kSimdWidth; first += Width) {
      uint64_t yes = 0, members = 0;
      for (uint32_t lane = first; lane < first + Width; ++lane) {
        if (!active(mask, lane)) continue;
        members |= uint64_t(1) << lane;
        if (*in[lane]) yes |= uint64_t(1) << lane;
      }
      for (uint32_t lane = first; lane < first + Width; ++lane) {
        if (!active(mask, lane)) continue;
        switch (V) {
          case Vote::Ballot: *out[lane] = Out(yes >> first); break;
          case Vote::All: *out[lane] = Out(yes == members); break;
          case Vote::Any: *out[lane] = Out(yes != 0); break;
          case Vote::IsFirst: *out[lane] = Out(lane == uint32_t(__builtin_ctzll(members))); break;
        }
      }
    }
  }
};

template <uint32_t Width>
struct BroadcastFirst {
  template <class T>
  static void apply(const T* const* in, T* const* out, uint32_t mask) {
    for (uint32_t first = 0; first < kSimdWidth; first += Width) {
      const uint32_t group = (mask >> first) & uint32_t((uint64_t(1) << Width) - 1);
      if (!group) continue;
      const T& v = *in[first + uint32_t(__builtin_ctz(group))];
      for (uint32_t lane = first; lane < first + Width; ++lane)
        if (active(mask, lane)) *out[lane] = v;
    }
  }
};

}  // namespace mtlsim::simd

namespace metal {

enum class mem_flags : unsigned {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
  mem_object_data = 16,
};
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(unsigned(a) | unsigned(b)); }
constexpr mem_flags operator&(mem_flags a, mem_flags b) { return mem_flags(unsigned(a) & unsigned(b)); }

inline void threadgroup_barrier(mem_flags flags, MTLSIM_CALLER) {
  const mtlsim::Site site = MTLSIM_CALLER_SITE;
  mtlsim_rt->barrier(unsigned(flags), &site);
}

inline void simdgroup_barrier(mem_flags, MTLSIM_CALLER) {
  const mtlsim::Site site = MTLSIM_CALLER_SITE;
  const char none = 0;
  mtlsim_rt->collective(nullptr, &none, nullptr, &site);
}

// Ballot results: one bit per lane of the group (32 for SIMD groups, 4 for quads).
template <unsigned Width>
class lane_vote {
 public:
  using vote_t = uint64_t;
  lane_vote() = default;
  explicit constexpr lane_vote(vote_t v) : v_(v) {}
  explicit constexpr operator vote_t() const { return v_; }
  constexpr bool all() const { return v_ == (vote_t(1) << Width) - 1; }
  constexpr bool any() const { return v_ != 0; }

 private:
  vote_t v_ = 0;
};
using simd_vote = lane_vote<32>;
using quad_vote = lane_vote<4>;

#define MTLSIM_REDUCTION(name, width, op)                                     \
  template <class T>                                                          \
  T name(T x, MTLSIM_CALLER) {                                                \
    using R = ::mtlsim::simd::Reduce<width, ::mtlsim::simd::op>;              \
    return ::mtlsim::simd::collective<R, T>(x, MTLSIM_CALLER_SITE);          \
  }
MTLSIM_REDUCTION(simd_sum, 32, Add)
MTLSIM_REDUCTION(simd_product, 32, Mul)
MTLSIM_REDUCTION(simd_max, 32, Max)
MTLSIM_REDUCTION(simd_min, 32, Min)
MTLSIM_REDUCTION(simd_and, 32, And)
MTLSIM_REDUCTION(simd_or, 32, Or)
MTLSIM_REDUCTION(simd_xor, 32, Xor)
MTLSIM_REDUCTION(quad_sum, 4, Add)
MTLSIM_REDUCTION(quad_product, 4, Mul)
MTLSIM_REDUCTION(quad_max, 4, Max)
MTLSIM_REDUCTION(quad_min, 4, Min)
MTLSIM_REDUCTION(quad_and, 4, And)
MTLSIM_REDUCTION(quad_or, 4, Or)
MTLSIM_REDUCTION(quad_xor, 4, Xor)
#undef MTLSIM_REDUCTION

#define MTLSIM_PREFIX(name, width, op, inclusive)                             \
  template <class T>                                                          \
  T name(T x, MTLSIM_CALLER) {                                                \
    using R = ::mtlsim::simd::Prefix<width, ::mtlsim::simd::op, inclusive>;   \
    return ::mtlsim::simd::collective<R, T>(x, MTLSIM_CALLER_SITE);          \
  }
MTLSIM_PREFIX(simd_prefix_inclusive_sum, 32, Add, true)
MTLSIM_PREFIX(simd_prefix_exclusive_sum, 32, Add, false)
MTLSIM_PREFIX(simd_prefix_inclusive_product, 32, Mul, true)
MTLSIM_PREFIX(simd_prefix_exclusive_product, 32, Mul, false)
MTLSIM_PREFIX(quad_prefix_inclusive_sum, 4, Add, true)
MTLSIM_PREFIX(quad_prefix_exclusive_sum, 4, Add, false)
MTLSIM_PREFIX(quad_prefix_inclusive_product, 4, Mul, true)
MTLSIM_PREFIX(quad_prefix_exclusive_product, 4, Mul, false)
#undef MTLSIM_PREFIX

#define MTLSIM_PERMUTE(name, width, source)                                                   \
  template <class T>                                                                          \
  T name(T x, ushort arg, MTLSIM_CALLER) {                                                    \
    using R = ::mtlsim::simd::Permute<width, ::mtlsim::simd::Source::source>;                 \
    return ::mtlsim::simd::collective<R, T>(::mtlsim::simd::Shuffle<T>{x, arg}, MTLSIM_CALLER_SITE); \
  }
MTLSIM_PERMUTE(simd_shuffle, 32, Index)
MTLSIM_PERMUTE(simd_broadcast, 32, Index)
MTLSIM_PERMUTE(simd_shuffle_up, 32, Up)
MTLSIM_PERMUTE(simd_shuffle_down, 32, Down)
MTLSIM_PERMUTE(simd_shuffle_xor, 32, Xor)
MTLSIM_PERMUTE(simd_shuffle_rotate_up, 32, RotateUp)
MTLSIM_PERMUTE(simd_shuffle_rotate_down, 32, RotateDown)
MTLSIM_PERMUTE(quad_shuffle, 4, Index)
MTLSIM_PERMUTE(quad_broadcast, 4, Index)
MTLSIM_PERMUTE(quad_shuffle_up, 4, Up)
MTLSIM_PERMUTE(quad_shuffle_down, 4, Down)
MTLSIM_PERMUTE(quad_shuffle_xor, 4, Xor)
MTLSIM_PERMUTE(quad_shuffle_rotate_up, 4, RotateUp)
MTLSIM_PERMUTE(quad_shuffle_rotate_down, 4, RotateDown)
#undef MTLSIM_PERMUTE

#define MTLSIM_FILL(name, up, width)                                                        \
  template <class T>                                                                        \
  T name(T x, T fill, ushort delta, ushort modulo = width, MTLSIM_CALLER) {                 \
    using R = ::mtlsim::simd::ShuffleAndFill<up>;                                           \
    return ::mtlsim::simd::collective<R, T>(::mtlsim::simd::Fill<T>{x, fill, delta, modulo}, \
                                            MTLSIM_CALLER_SITE);                            \
  }
MTLSIM_FILL(simd_shuffle_and_fill_up, true, 32)
MTLSIM_FILL(simd_shuffle_and_fill_down, false, 32)
MTLSIM_FILL(quad_shuffle_and_fill_up, true, 4)
MTLSIM_FILL(quad_shuffle_and_fill_down, false, 4)
#undef MTLSIM_FILL

#define MTLSIM_BROADCAST_FIRST(name, width)                                              \
  template <class T>                                                                     \
  T name(T x, MTLSIM_CALLER) {                                                           \
    return ::mtlsim::simd::collective<::mtlsim::simd::BroadcastFirst<width>, T>(x, MTLSIM_CALLER_SITE); \
  }
MTLSIM_BROADCAST_FIRST(simd_broadcast_first, 32)
MTLSIM_BROADCAST_FIRST(quad_broadcast_first, 4)
#undef MTLSIM_BROADCAST_FIRST

#define MTLSIM_VOTE(name, width, vote, result)                                             \
  inline result name(bool predicate, MTLSIM_CALLER) {                                     \
    using R = ::mtlsim::simd::Votes<width, ::mtlsim::simd::Vote::vote>;                   \
    using Out = ::metal::conditional_t<::metal::is_same_v<result, bool>, bool, uint64_t>; \
    return result(::mtlsim::simd::collective<R, Out>(predicate, MTLSIM_CALLER_SITE));     \
  }
MTLSIM_VOTE(simd_ballot, 32, Ballot, simd_vote)
MTLSIM_VOTE(simd_all, 32, All, bool)
MTLSIM_VOTE(simd_any, 32, Any, bool)
MTLSIM_VOTE(quad_ballot, 4, Ballot, quad_vote)
MTLSIM_VOTE(quad_all, 4, All, bool)
MTLSIM_VOTE(quad_any, 4, Any, bool)
#undef MTLSIM_VOTE

inline simd_vote simd_active_threads_mask(MTLSIM_CALLER) {
  return simd_ballot(true, mtlsim_file, mtlsim_line);
}
inline quad_vote quad_active_threads_mask(MTLSIM_CALLER) {
  return quad_ballot(true, mtlsim_file, mtlsim_line);
}
inline bool simd_is_first(MTLSIM_CALLER) {
  using R = ::mtlsim::simd::Votes<32, ::mtlsim::simd::Vote::IsFirst>;
  return ::mtlsim::simd::collective<R, bool>(true, MTLSIM_CALLER_SITE);
}
inline bool quad_is_first(MTLSIM_CALLER) {
  using R = ::mtlsim::simd::Votes<4, ::mtlsim::simd::Vote::IsFirst>;
  return ::mtlsim::simd::collective<R, bool>(true, MTLSIM_CALLER_SITE);
}
inline bool simd_is_helper_thread() { return false; }

}  // namespace metal
