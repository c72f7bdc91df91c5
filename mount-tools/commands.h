// Subcommand groups of the ckptfs tool. Each Register* adds its subcommands
// to `app`; a subcommand's callback stores its exit code in *exit_code.
//
// Exit codes (shared by every subcommand, documented in README.md):
//   0 ok, 1 usage error, 2 bad input (corrupt or unsupported data),
//   3 I/O error, 4 fsck found problems, 5 internal error.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "codec/common/status.h"

namespace ckptfs::tools {

enum ExitCode : int {
  kExitOk = 0,
  kExitUsage = 1,
  kExitBadInput = 2,
  kExitIo = 3,
  kExitProblemsFound = 4,
  kExitInternal = 5,
};

// Maps a Status to an exit code and prints "ckptfs: <context>: <message>" to
// stderr when it is an error.
int ReportStatus(const Status& status, std::string_view context);

// `ckptfs inspect-blob PATH`: describes a bare blob file; returns the exit code.
int InspectBlobFile(const std::string& path, bool json, bool chunks);

// encode / decode / inspect a single blob (codec only, no store).
void RegisterBlobCommands(CLI::App& app, int* exit_code);
// mount / umount (the FUSE daemon).
void RegisterMountCommands(CLI::App& app, int* exit_code);
// stats / inspect / restore / fsck / gc on a store (mounted or not).
void RegisterStoreCommands(CLI::App& app, int* exit_code);

}  // namespace ckptfs::tools

namespace ckptfs::tools {
// The argument vector of "ckptfs mount ..." for an invocation as the mount
// helper "mount.ckptfs BACKING MOUNTPOINT [-o OPTIONS]" (argv[0] basename).
std::vector<std::string> MountHelperArgs(int argc, char** argv);
}  // namespace ckptfs::tools
