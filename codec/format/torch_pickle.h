// Reads the object graph of a torch.save data.pkl (see pickle_machine.h) and
// finds every storage it references: the storage key (the zip record
// data/<key>), its dtype, its element count and the tensor that names it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codec/common/status.h"
#include "codec/format/layout.h"
#include "codec/format/pickle_machine.h"

namespace ckptfs {

struct TorchStorage {
  std::string key;                // record name under <prefix>/data/
  DType dtype = DType::kUnknown;  // unknown when the pickle does not say
  uint64_t numel = 0;             // elements, from the persistent id
  // Dict key path of the first tensor (in pickle order) that views this
  // storage, e.g. "model.fc1.weight", "optimizer.state.0.exp_avg"; list and
  // tuple indices are numbers; a tensor at the root is named "tensor".
  std::string name;
  // That tensor's shape when it covers the whole storage contiguously from
  // offset 0, else {numel}.
  std::vector<uint64_t> shape;
};

// The dtype a storage class or dtype global names ("torch.FloatStorage",
// "torch.bfloat16", ...); kUnknown for anything else.
DType TorchDTypeFromGlobal(std::string_view name);

// Every storage referenced by `graph`, each once, in pickle order. Walks
// dicts (plain and OrderedDict), lists, tuples and object state; each node
// is visited once, so cost is linear in the graph. Corruption when a
// persistent id is malformed; InvalidArgument past limits.max_tensors or
// nesting deeper than limits.max_pickle_depth. Thread-safe.
Result<std::vector<TorchStorage>> FindTorchStorages(const PickleGraph& graph, const ParseLimits& limits);

}  // namespace ckptfs
