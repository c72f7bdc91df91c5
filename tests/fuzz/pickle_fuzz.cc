// libFuzzer target: the bounded pickle machine and the torch storage walk.
#include <cstdint>
#include <cstdlib>

#include "codec/format/pickle_machine.h"
#include "codec/format/torch_pickle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptfs::ParseLimits limits;
  limits.max_pickle_ops = 1'000'000;
  limits.max_pickle_depth = 200;
  auto graph = ckptfs::RunPickle({reinterpret_cast<const std::byte*>(data), size}, limits);
  if (!graph.ok()) return 0;
  if (graph->root() == nullptr) std::abort();  // STOP always sets a root
  auto storages = ckptfs::FindTorchStorages(*graph, limits);
  if (storages.ok()) {
    for (const auto& s : *storages)
      if (s.name.empty() || (s.shape.empty() && s.numel != 1)) std::abort();
  }
  return 0;
}
