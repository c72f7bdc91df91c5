// The `.metadata` file of a torch.distributed.checkpoint (DCP) save, and
// naming a shard's tensors by it.
//
// A shard `__R_k.distcp` is a sequence of torch.save archives (dcp.h) whose
// tensors carry no names: which parameter or optimizer state each archive
// holds is recorded only in the coordinator's `.metadata`, a pickle whose
// `storage_data` maps each item (its fully qualified name, FQN) to
// (relative_path, offset, length) in a shard file. The coordinator writes it
// after every rank has written its shard, so when a shard is committed the
// metadata of its own save usually does not exist yet; the previous save's
// does, and a shard of the same plan holds the same items in the same order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/format/layout.h"

namespace ckptfs {

// One item of a DCP save: where its bytes are (one torch.save archive).
struct DcpStorageItem {
  std::string fqn;
  std::string relative_path;  // the shard file's name, e.g. "__0_0.distcp"
  uint64_t offset = 0;
  uint64_t length = 0;
};

// The storage items of a `.metadata` pickle, read without running it
// (pickle_machine.h). Accepts PyTorch's form (a `Metadata` object whose
// BUILD state holds `storage_data`: {MetadataIndex(fqn, offset, index):
// _StorageInfo(relative_path, offset, length)}, each a dataclass with its
// fields in its BUILD state) and the same structure as plain dicts and
// tuples ({"storage_data": {(fqn, offsets): (relative_path, offset,
// length)}}). NotFound when the pickle holds no storage_data; Corruption
// for an item whose fields are missing or of the wrong type.
Result<std::vector<DcpStorageItem>> ParseDcpMetadata(ByteSpan pickle, const ParseLimits& limits);

// Renames the tensors of `layout` (ParseTorchZipSequence's: "<archive>/tensor"
// for each archive that is one bare tensor) to their FQNs, using the items
// that `items` give the file `file_name`, when they describe this file's
// plan exactly: as many items as archives, the k-th by offset as long as
// the k-th archive wherever that archive holds a tensor (items of pickled
// objects may change length between saves), each tensor-bearing archive
// one bare tensor, and no FQN twice. Only then can the optimizer state
// be told from the weights by name; false leaves `layout` unchanged.
bool NameDcpShard(Layout* layout, std::string_view file_name, const std::vector<DcpStorageItem>& items);

// True for a DCP shard tensor's positional name ("<archive>/..."), which
// says nothing about what it holds.
bool IsPositionalDcpName(std::string_view name);

}  // namespace ckptfs
