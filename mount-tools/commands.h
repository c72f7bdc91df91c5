// Subcommand groups of the ckptfs tool. Each Register* adds its subcommands
// to `app`; a subcommand's callback stores its exit code in *exit_code.
//
// Exit codes (shared by every subcommand, documented in README.md):
//   0 ok, 1 usage error, 2 bad input (corrupt or unsupported data),
//   3 I/O error, 4 fsck found problems, 5 internal error.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
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

// The decoded-chunk LRU of a one-shot command that decodes a file (decode,
// inspect, restore) whose chain is `depth` versions deep, on `threads`
// threads: the chunks in flight, not a mount's cache. Such a command
// reads each chunk of a chain once, in order (what a decode takes ahead of
// itself for a later chunk waits in the awaited room, outside the LRU);
// the LRU keeps a level's chunks while the levels above read them (a
// step-predicted chunk reads its base and the state of its own level and
// of the level below). A larger LRU only holds memory that is touched once:
// chunk buffers recycle through the LRU and its idle list, which together
// hold at most this many bytes, and every byte beyond is fresh memory,
// whose first touch (page faults, zeroing, and on a virtual machine that
// returns freed memory to its host the host's fault too) cost more than
// decoding into it (docs/bench.md, "A one-shot decode's chunk cache").
// Default-size chunks: depth + 3 per thread, at least 24 MiB (24 MiB on
// two threads made a restore of a four-version chain slower).
uint64_t CommandChunkCacheBytes(unsigned threads, uint32_t depth);

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
