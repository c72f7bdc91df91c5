// The contents of lossy::Scratch (private to the codec): buffers and zstd
// contexts reused across chunks. Vectors only grow; resize() on a vector that
// is already large enough costs nothing but the value initialisation of new
// elements.
#pragma once

#include <zstd.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "codec/tensor/lossy/kernels.h"
#include "codec/tensor/lossy/lossy.h"

namespace ckptfs::lossy {

struct LogFractionTable;  // log_index.h

struct ZstdCDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct ZstdDDeleter {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

struct Scratch::Buffers {
  std::vector<float> residual;
  std::vector<float> residual_alt;  // the key-frame residual of a delta candidate
  std::vector<double> norm_partials;
  std::vector<double> error_partials;
  std::vector<uint32_t> histogram;
  std::vector<uint32_t> histogram_alt;
  std::vector<std::byte> packed;
  std::vector<std::byte> base_slice;  // a slice of a base made slice by slice (base_slices.h)
  std::vector<std::byte> base_whole;  // such a base made whole, for a decoder that reads it whole
  std::vector<uint32_t> exact_positions;
  std::vector<std::byte> exact_raw;
  std::vector<std::byte> exact_list;
  std::vector<std::byte> planes;
  std::vector<int32_t> log_index;       // log mode: each element's grid index
  std::vector<int32_t> log_base_index;  // log mode: each base element's grid index
  std::vector<uint32_t> log_symbols;  // log mode: one symbol per element before packing
  std::vector<uint8_t> log_masks;     // log mode: a byte per 8 elements, which a scalar step must visit
  std::shared_ptr<const LogFractionTable> log_table;  // log mode: the vector passes' table of the last grid (format's rounding)
  std::shared_ptr<const LogFractionTable> log_code_table;  // log mode: the encoder's table of that grid rounded in log
  std::vector<std::byte> zstd_main;  // compressed frames before they are assembled
  std::vector<std::byte> zstd_exact;
  std::vector<uint8_t> symbols;       // one byte per symbol, for the rANS main stream
  std::vector<std::byte> rans_main;  // the rANS alternative of the main stream
  std::vector<std::byte> rans_contexts;      // the context rANS alternative (dithered chunks)
  std::vector<uint32_t> rans_context_tables;  // its decode tables
  std::vector<uint8_t> trellis_back;     // trellis mode: the Viterbi search's choices, 8 per element
  std::vector<uint8_t> trellis_symbols;  // trellis mode: one symbol per element
  std::vector<uint8_t> trellis_states;   // trellis mode: each element's state (its symbol's context)
  std::vector<std::byte> trellis_recon;  // trellis mode: its reconstruction, until it wins
  std::unique_ptr<ZSTD_CCtx, ZstdCDeleter> cctx;
  std::unique_ptr<ZSTD_DCtx, ZstdDDeleter> dctx;
  std::unique_ptr<LossyKernels> cpu_kernels;
};

// Grows `v` to at least n elements without shrinking (keeps the capacity).
template <typename T>
void EnsureSize(std::vector<T>* v, size_t n) {
  if (v->size() < n) v->resize(n);
}

}  // namespace ckptfs::lossy
