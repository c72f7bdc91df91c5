#include "codec/format/torch_zip.h"

#include <fmt/format.h>

#include <unordered_map>

#include "codec/format/pickle_machine.h"
#include "codec/format/segments.h"
#include "codec/format/torch_pickle.h"

namespace ckptfs {
namespace {

constexpr std::string_view kPickleRecord = "/data.pkl";

// The archive prefix: the name of the one top-level "<prefix>/data.pkl".
Result<const ZipEntry*> FindPickleRecord(const ZipArchive& archive) {
  const ZipEntry* found = nullptr;
  for (const ZipEntry& e : archive.entries) {
    std::string_view name = e.name;
    if (name.size() <= kPickleRecord.size() || !name.ends_with(kPickleRecord)) continue;
    std::string_view prefix = name.substr(0, name.size() - kPickleRecord.size());
    if (prefix.find('/') != std::string_view::npos) continue;
    if (found != nullptr)
      return Status::Corruption(fmt::format("torch zip: two pickles, {} and {}", found->name, e.name));
    found = &e;
  }
  if (found == nullptr) return Status::NotFound("zip has no <prefix>/data.pkl record");
  return found;
}

}  // namespace

Result<Layout> ParseTorchZip(ByteSpan file, const ZipArchive& archive, const ParseLimits& limits) {
  ASSIGN_OR_RETURN(const ZipEntry* pickle_entry, FindPickleRecord(archive));
  std::string prefix = pickle_entry->name.substr(0, pickle_entry->name.size() - kPickleRecord.size());
  if (pickle_entry->method != 0)
    return Status::Unsupported(fmt::format("torch zip: {} is compressed (method {}), want stored",
                                           pickle_entry->name, pickle_entry->method));
  std::unordered_map<std::string_view, const ZipEntry*> by_name;
  for (const ZipEntry& e : archive.entries)
    if (!by_name.emplace(e.name, &e).second)
      return Status::Corruption(fmt::format("torch zip: record {} appears twice", e.name));

  bool big_endian = false;
  if (auto it = by_name.find(prefix + "/byteorder"); it != by_name.end() && it->second->method == 0) {
    std::string_view order = AsChars(file.subspan(it->second->payload_offset, it->second->compressed_size));
    big_endian = order == "big";
  }

  ByteSpan pickle = file.subspan(pickle_entry->payload_offset, pickle_entry->compressed_size);
  ASSIGN_OR_RETURN(PickleGraph graph, RunPickle(pickle, limits));
  ASSIGN_OR_RETURN(std::vector<TorchStorage> storages, FindTorchStorages(graph, limits));

  Layout layout;
  layout.format = FileFormat::kTorchZip;
  std::vector<Segment> tensor_segments;
  for (TorchStorage& s : storages) {
    std::string record = prefix + "/data/" + s.key;
    auto it = by_name.find(record);
    if (it == by_name.end())
      return Status::Corruption(fmt::format("torch zip: storage {} ({}) has no record {}", s.key, s.name, record));
    const ZipEntry& e = *it->second;
    if (e.method != 0)
      return Status::Unsupported(
          fmt::format("torch zip: tensor record {} is compressed (method {}), want stored", record, e.method));
    uint64_t elem = DTypeSize(s.dtype);
    uint64_t want = 0;
    // Unknown dtype or a size that does not match: keep the bytes verbatim.
    if (elem == 0 || __builtin_mul_overflow(s.numel, elem, &want) || want != e.compressed_size || want == 0)
      continue;
    Segment seg{e.payload_offset, e.compressed_size, static_cast<int32_t>(layout.tensors.size())};
    tensor_segments.push_back(seg);
    layout.tensors.push_back(TensorInfo{std::move(s.name), s.dtype, std::move(s.shape), big_endian});
    layout.zip_crcs.push_back(ZipCrcField{e.payload_offset, e.compressed_size, e.crc_offsets});
  }
  ASSIGN_OR_RETURN(layout.segments, CoverWithVerbatim(std::move(tensor_segments), file.size()));
  return layout;
}

}  // namespace ckptfs
