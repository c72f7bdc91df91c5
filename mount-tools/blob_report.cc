#include "mount-tools/blob_report.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>

#include "codec/container/blob_format.h"
#include "codec/container/lossy_report.h"

namespace ckptfs::tools {
namespace {

double Ratio(uint64_t logical, uint64_t stored) { return stored ? double(logical) / double(stored) : 0.0; }

}  // namespace

nlohmann::json DescribeBlob(const BlobReader& r, bool with_chunks) {
  struct SegmentSummary {
    uint64_t stored = 0;
    std::map<std::string, uint32_t> codecs;
  };
  std::vector<SegmentSummary> seg(r.segments().size());
  for (const ChunkInfo& c : r.chunks()) {
    if (c.segment < 0 || static_cast<size_t>(c.segment) >= seg.size()) continue;
    seg[c.segment].stored += c.stored_length;
    seg[c.segment].codecs[std::string(ChunkCodecName(c.codec))]++;
  }
  auto codec_list = [](const SegmentSummary& s) {
    std::vector<std::string> names;
    for (const auto& [name, n] : s.codecs) names.push_back(fmt::format("{}x{}", name, n));
    return fmt::format("{}", fmt::join(names, ","));
  };

  nlohmann::json j;
  j["format"] = std::string(FileFormatName(r.format()));
  j["logical_bytes"] = r.logical_size();
  j["stored_bytes"] = r.stored_size();
  j["ratio"] = Ratio(r.logical_size(), r.stored_size());
  j["file_checksum"] = fmt::format("{:016x}", r.file_checksum());
  j["base"] = r.base() ? nlohmann::json(r.base()->Hex()) : nlohmann::json(nullptr);
  if (r.ref()) j["ref"] = r.ref()->Hex();
  uint64_t verbatim_logical = 0, verbatim_stored = 0;
  j["tensors"] = nlohmann::json::array();
  // Achieved error per lossy tensor (from the chunk parameters; a blob with
  // damaged parameters fails Open, so this cannot fail on an open reader).
  std::map<int32_t, TensorLossyReport> lossy_by_tensor;
  if (Result<std::vector<TensorLossyReport>> reports = LossyTensorReports(r); reports.ok())
    for (const TensorLossyReport& t : *reports) lossy_by_tensor[t.tensor] = t;
  double max_rel_l2 = 0;
  for (const auto& [t, rep] : lossy_by_tensor) max_rel_l2 = std::max(max_rel_l2, rep.rel_l2);
  j["lossy"] = lossy_by_tensor.empty() ? nlohmann::json(nullptr) : nlohmann::json({{"max_rel_l2", max_rel_l2}});
  for (size_t i = 0; i < r.segments().size(); ++i) {
    const SegmentInfo& s = r.segments()[i];
    if (s.tensor < 0) {
      verbatim_logical += s.length;
      verbatim_stored += seg[i].stored;
      continue;
    }
    const TensorInfo& t = r.tensors()[s.tensor];
    j["tensors"].push_back({{"name", t.name},
                            {"dtype", std::string(DTypeName(t.dtype))},
                            {"shape", t.shape},
                            {"offset", s.offset},
                            {"logical_bytes", s.length},
                            {"stored_bytes", seg[i].stored},
                            {"ratio", Ratio(s.length, seg[i].stored)},
                            {"codecs", codec_list(seg[i])}});
    if (auto it = lossy_by_tensor.find(s.tensor); it != lossy_by_tensor.end()) {
      const TensorLossyReport& l = it->second;
      j["tensors"].back()["lossy"] = {{"rel_l2", l.rel_l2},       {"max_abs", l.max_abs},
                                      {"bits", l.max_bits},       {"pruned", l.pruned},
                                      {"quantized", l.quantized}, {"exact", l.exact},
                                      {"budget_rel_l2", l.budget_rel_l2}, {"update_rel", l.update_rel}};
      if (l.predicted_chunks > 0) j["tensors"].back()["lossy"]["predicted_chunks"] = l.predicted_chunks;
      if (l.copy_chunks > 0) j["tensors"].back()["lossy"]["copy_chunks"] = l.copy_chunks;
      if (l.ref_copy_chunks > 0) j["tensors"].back()["lossy"]["ref_copy_chunks"] = l.ref_copy_chunks;
      if (l.step_space_chunks > 0) j["tensors"].back()["lossy"]["step_space_chunks"] = l.step_space_chunks;
      if (l.dithered_chunks > 0) j["tensors"].back()["lossy"]["dithered_chunks"] = l.dithered_chunks;
      if (l.row_column_chunks > 0) j["tensors"].back()["lossy"]["row_column_chunks"] = l.row_column_chunks;
      if (l.trellis_chunks > 0) j["tensors"].back()["lossy"]["trellis_chunks"] = l.trellis_chunks;
      if (l.low_rank_chunks > 0) {
        j["tensors"].back()["lossy"]["low_rank_chunks"] = l.low_rank_chunks;
        j["tensors"].back()["lossy"]["low_rank"] = l.max_low_rank;
      }
      if (l.log_chunks > 0) {
        j["tensors"].back()["lossy"]["max_rel"] = l.max_rel;
        j["tensors"].back()["lossy"]["log_chunks"] = l.log_chunks;
      }
    }
  }
  j["verbatim"] = {{"logical_bytes", verbatim_logical}, {"stored_bytes", verbatim_stored}};
  if (with_chunks) {
    j["chunks"] = nlohmann::json::array();
    for (const ChunkInfo& c : r.chunks())
      j["chunks"].push_back({{"offset", c.logical_offset},
                             {"length", c.logical_length},
                             {"codec", std::string(ChunkCodecName(c.codec))},
                             {"stored_offset", c.stored_offset},
                             {"stored_bytes", c.stored_length},
                             {"checksum", fmt::format("{:016x}", c.checksum)}});
  }
  return j;
}

void PrintBlobReport(const std::string& title, const nlohmann::json& j) {
  std::cout << fmt::format("{}: format {}, {} -> {} bytes ({:.3f}x), base {}, {}\n", title,
                           j["format"].get<std::string>(), j["logical_bytes"].get<uint64_t>(),
                           j["stored_bytes"].get<uint64_t>(), j["ratio"].get<double>(),
                           j["base"].is_null() ? std::string("none") : j["base"].get<std::string>(),
                           j["lossy"].is_null() ? std::string("lossless")
                                                : fmt::format("lossy, max rel_l2 {:.3g}",
                                                              j["lossy"]["max_rel_l2"].get<double>()));
  std::cout << fmt::format("{:<48} {:>6} {:>18} {:>12} {:>12} {:>8}  {}\n", "tensor", "dtype", "shape", "bytes",
                           "stored", "ratio", "codecs");
  for (const auto& t : j["tensors"]) {
    std::string lossy;
    if (t.contains("lossy")) {
      const auto& l = t["lossy"];
      lossy = fmt::format("  rel_l2 {:.3g} max_abs {:.3g} bits {}", l["rel_l2"].get<double>(),
                          l["max_abs"].get<double>(), l["bits"].get<int>());
      if (l.contains("max_rel")) lossy += fmt::format(" log max_rel {:.3g}", l["max_rel"].get<double>());
      if (l["budget_rel_l2"].get<double>() > 0) lossy += fmt::format(" budget {:.3g}", l["budget_rel_l2"].get<double>());
      if (l["update_rel"].get<double>() > 0) lossy += fmt::format(" update {:.3g}", l["update_rel"].get<double>());
      // Step-space chunks measure their error, budget and update on Adam's
      // step m / (sqrt(v) + eps), not on the tensor's values.
      if (l.contains("step_space_chunks")) lossy += " (on the step)";
      if (l.contains("low_rank")) lossy += fmt::format(" rank {}", l["low_rank"].get<int>());
      if (l.contains("dithered_chunks")) lossy += " dithered";
      if (l.contains("row_column_chunks")) lossy += " row-column base";
      if (l.contains("trellis_chunks")) lossy += " trellis";
    }
    std::cout << fmt::format("{:<48} {:>6} {:>18} {:>12} {:>12} {:>8.3f}  {}{}\n", t["name"].get<std::string>(),
                             t["dtype"].get<std::string>(),
                             fmt::format("[{}]", fmt::join(t["shape"].get<std::vector<uint64_t>>(), ", ")),
                             t["logical_bytes"].get<uint64_t>(), t["stored_bytes"].get<uint64_t>(),
                             t["ratio"].get<double>(), t["codecs"].get<std::string>(), lossy);
  }
  const auto& v = j["verbatim"];
  std::cout << fmt::format("{:<48} {:>6} {:>18} {:>12} {:>12} {:>8.3f}\n", "(verbatim bytes)", "", "",
                           v["logical_bytes"].get<uint64_t>(), v["stored_bytes"].get<uint64_t>(),
                           Ratio(v["logical_bytes"].get<uint64_t>(), v["stored_bytes"].get<uint64_t>()));
  if (j.contains("chunks"))
    for (const auto& c : j["chunks"])
      std::cout << fmt::format("  chunk @{:<12} len {:<10} {:<14} stored {:<10} at {:<12} xxh3 {}\n",
                               c["offset"].get<uint64_t>(), c["length"].get<uint64_t>(),
                               c["codec"].get<std::string>(), c["stored_bytes"].get<uint64_t>(),
                               c["stored_offset"].get<uint64_t>(), c["checksum"].get<std::string>());
}

bool LooksLikeBlob(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  uint8_t head[8] = {};
  bool match = ::pread(fd, head, sizeof head, 0) == static_cast<ssize_t>(sizeof head) &&
               std::equal(std::begin(head), std::end(head), kBlobHeaderMagic.begin());
  ::close(fd);
  return match;
}

}  // namespace ckptfs::tools
