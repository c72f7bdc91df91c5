#include "codec/format/dcp_metadata.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>

#include "codec/format/pickle_machine.h"

namespace ckptfs {
namespace {

using Kind = PickleNode::Kind;

// The value of `key` in a dict node; nullptr when absent.
const PickleNode* Lookup(const PickleNode* dict, std::string_view key) {
  if (dict == nullptr || dict->kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : dict->entries)
    if (k->IsString() && k->text == key) return v;
  return nullptr;
}

// Field `name` (or, for a tuple, the one at `position`) of a record: a
// dataclass instance (a call node whose BUILD state is its __dict__, or
// (None, slots) for a dataclass with __slots__), a dict, or a tuple.
const PickleNode* Field(const PickleNode* record, std::string_view name, size_t position) {
  if (record == nullptr) return nullptr;
  switch (record->kind) {
    case Kind::kDict: return Lookup(record, name);
    case Kind::kTuple:
    case Kind::kList: return position < record->items.size() ? record->items[position] : nullptr;
    case Kind::kCall: {
      const PickleNode* state = record->state;
      if (state != nullptr && state->kind == Kind::kTuple && state->items.size() == 2) {
        if (const PickleNode* v = Lookup(state->items[1], name)) return v;
        state = state->items[0];
      }
      return Lookup(state, name);
    }
    default: return nullptr;
  }
}

}  // namespace

Result<std::vector<DcpStorageItem>> ParseDcpMetadata(ByteSpan pickle, const ParseLimits& limits) {
  ASSIGN_OR_RETURN(PickleGraph graph, RunPickle(pickle, limits));
  const PickleNode* storage = Field(graph.root(), "storage_data", SIZE_MAX);
  if (storage == nullptr || storage->kind != Kind::kDict)
    return Status::NotFound("dcp metadata: no storage_data");
  std::vector<DcpStorageItem> items;
  items.reserve(storage->entries.size());
  for (const auto& [index, info] : storage->entries) {
    const PickleNode* fqn = Field(index, "fqn", 0);
    const PickleNode* path = Field(info, "relative_path", 0);
    const PickleNode* offset = Field(info, "offset", 1);
    const PickleNode* length = Field(info, "length", 2);
    if (fqn == nullptr || !fqn->IsString() || path == nullptr || !path->IsString() || offset == nullptr ||
        !offset->IsInt() || offset->int_value < 0 || length == nullptr || !length->IsInt() || length->int_value < 0)
      return Status::Corruption(fmt::format("dcp metadata: storage item {} is not (fqn; relative_path, offset, length)",
                                            items.size()));
    items.push_back(DcpStorageItem{fqn->text, path->text, static_cast<uint64_t>(offset->int_value),
                                   static_cast<uint64_t>(length->int_value)});
  }
  return items;
}

bool IsPositionalDcpName(std::string_view name) {
  const size_t slash = name.find('/');
  return slash != std::string_view::npos && slash > 0 &&
         std::all_of(name.begin(), name.begin() + static_cast<ptrdiff_t>(slash),
                     [](char c) { return c >= '0' && c <= '9'; });
}

bool NameDcpShard(Layout* layout, std::string_view file_name, const std::vector<DcpStorageItem>& items) {
  if (layout->format != FileFormat::kDcp || layout->archives.empty()) return false;
  std::vector<const DcpStorageItem*> mine;
  for (const DcpStorageItem& item : items)
    if (item.relative_path == file_name) mine.push_back(&item);
  if (mine.size() != layout->archives.size()) return false;
  std::sort(mine.begin(), mine.end(), [](const auto* a, const auto* b) { return a->offset < b->offset; });
  // The archive of each tensor: "<k>/" names a bare tensor saved as archive k.
  std::vector<std::string> names(layout->tensors.size());
  std::vector<int> tensors_in_archive(layout->archives.size(), 0);
  std::set<std::string_view> seen;
  for (size_t t = 0; t < layout->tensors.size(); ++t) {
    const std::string_view name = layout->tensors[t].name;
    if (!IsPositionalDcpName(name)) return false;
    const size_t slash = name.find('/');
    if (name.substr(slash + 1) != "tensor") return false;  // not an archive of one bare tensor
    size_t k = 0;
    for (char c : name.substr(0, slash)) {
      k = k * 10 + static_cast<size_t>(c - '0');
      if (k >= layout->archives.size()) return false;
    }
    if (++tensors_in_archive[k] > 1 || mine[k]->length != layout->archives[k].second) return false;
    if (!seen.insert(mine[k]->fqn).second || mine[k]->fqn.empty()) return false;
    names[t] = mine[k]->fqn;
  }
  for (size_t t = 0; t < layout->tensors.size(); ++t) layout->tensors[t].name = std::move(names[t]);
  return true;
}

}  // namespace ckptfs
