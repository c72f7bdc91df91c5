// ckptfs: the command-line tool. Subcommand groups live in cmd_*.cc.
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "codec/container/blob_format.h"
#include "fs/manifest.h"
#include "fs/store.h"
#include "mount-tools/commands.h"

namespace ckptfs::tools {

int ReportStatus(const Status& status, std::string_view context) {
  if (status.ok()) return kExitOk;
  std::cerr << "ckptfs: " << context << ": " << status.ToString() << "\n";
  switch (status.code()) {
    case StatusCode::kOk: return kExitOk;
    case StatusCode::kInvalidArgument: return kExitUsage;
    case StatusCode::kCorruption:
    case StatusCode::kChecksumMismatch:
    case StatusCode::kUnsupported: return kExitBadInput;
    case StatusCode::kNotFound:
    case StatusCode::kNoSpace:
    case StatusCode::kIo:
    case StatusCode::kNoMemory: return kExitIo;
    case StatusCode::kInternal: return kExitInternal;
  }
  return kExitInternal;
}

}  // namespace ckptfs::tools

int main(int argc, char** argv) {
  using namespace ckptfs::tools;
  CLI::App app{"ckptfs: a compressing filesystem for deep-learning checkpoints"};
  app.require_subcommand(1);
  // What this build reads and writes, so that an operator can tell whether
  // a store written elsewhere is readable here.
  app.set_version_flag("--version",
                       fmt::format("ckptfs {}\nstore format {} (reads {}), manifest version {} (reads {}), "
                                   "blob format {} (reads {} and {})",
                                   CKPTFS_VERSION, ckptfs::fs::kStoreFormatVersion, ckptfs::fs::kStoreFormatVersion,
                                   ckptfs::fs::Manifest::kNewestVersion, "1 and 2",
                                   ckptfs::kBlobVersion, ckptfs::kBlobVersionRawIndex, ckptfs::kBlobVersion));
  int exit_code = kExitOk;
  RegisterBlobCommands(app, &exit_code);
  RegisterMountCommands(app, &exit_code);
  RegisterStoreCommands(app, &exit_code);
  // Invoked as the mount helper (mount -t fuse.ckptfs / mount.ckptfs)?
  std::string self = argv[0];
  std::vector<std::string> helper;
  std::string base = self.substr(self.rfind('/') + 1);
  if (base == "mount.ckptfs" || base == "mount.fuse.ckptfs") helper = MountHelperArgs(argc, argv);
  std::vector<char*> helper_argv;
  for (std::string& a : helper) helper_argv.push_back(a.data());
  if (!helper.empty()) {
    argc = static_cast<int>(helper_argv.size());
    argv = helper_argv.data();
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << "\n";
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  return exit_code;
}
