// The output of `decode` and `restore`: written piece by piece into a
// ReplacementFile, so OUT keeps its old bytes unless the whole file was
// decoded and its checksum matched.
#pragma once

#include <utility>

#include "codec/common/replacement_file.h"
#include "codec/container/blob.h"
#include "mount-tools/progress.h"

namespace ckptfs::tools {

class OutputFileSink final : public ByteSink {
 public:
  OutputFileSink(ReplacementFile file, Progress* progress) : file_(std::move(file)), progress_(progress) {}
  Status Append(ByteSpan data) override {
    progress_->Add(data.size());
    return file_.Append(data);
  }
  Status Finish() { return file_.Commit(); }

 private:
  ReplacementFile file_;
  Progress* progress_;
};

}  // namespace ckptfs::tools
