#include "codec/tensor/scratch.h"

#include <zstd.h>

#include <memory>
#include <new>

#include "codec/tensor/lossy/lossy.h"

namespace ckptfs {

CodecScratch::CodecScratch() : cctx_(ZSTD_createCCtx()), dctx_(ZSTD_createDCtx()) {
  if (cctx_ == nullptr || dctx_ == nullptr) {
    ZSTD_freeCCtx(cctx_);
    ZSTD_freeDCtx(dctx_);
    throw std::bad_alloc();
  }
}

lossy::Scratch& CodecScratch::lossy() {
  if (!lossy_) lossy_ = std::make_unique<lossy::Scratch>();
  return *lossy_;
}

CodecScratch::~CodecScratch() {
  ZSTD_freeCCtx(cctx_);
  ZSTD_freeDCtx(dctx_);
}

}  // namespace ckptfs
