// Which tensor a reader that is consuming one tensor will read next, so
// that its first chunks can be decoded before the reader gets there.
//
// torch.load reads a torch zip's storage records in the order their keys
// appear in data.pkl (0, 1, 2, ...), while torch.save writes the records
// sorted as text (data/0, data/1, data/10, data/100, ...): the next record
// read is rarely the next one in the file. The layout's tensor list is in
// pickle order (the order the pickle walker meets the storages), so for a
// torch zip the next tensor is the one with the next tensor index. Other
// formats (safetensors, npy, npz, dcp) are read in file order, or in an
// order the file does not record: the guess is the next tensor segment in
// the file.
#pragma once

#include <cstdint>
#include <vector>

#include "codec/container/blob.h"
#include "codec/format/layout.h"

namespace ckptfs::fs {

// The segment holding the tensor a reader of tensor segment `segment` most
// likely reads next, or -1 when there is none (the last tensor, or
// `segment` is not a tensor segment).
int32_t PredictNextTensorSegment(FileFormat format, const std::vector<SegmentInfo>& segments, int32_t segment);

}  // namespace ckptfs::fs
