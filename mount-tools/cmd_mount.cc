// ckptfs mount / umount (and the mount.ckptfs helper form).
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "fs/filesystem.h"
#include "fs/options.h"
#include "mount-tools/commands.h"

namespace ckptfs::tools {
namespace {

struct MountArgs {
  std::string backing, mountpoint;
  bool foreground = false;
  std::vector<std::string> option_lists;
};

int RunMount(const MountArgs& args) {
  fs::MountOptions options;
  options.backing = args.backing;
  options.mountpoint = args.mountpoint;
  options.foreground = args.foreground;
  for (const std::string& list : args.option_lists) {
    Status s = fs::ParseMountOptionList(list, &options);
    if (!s.ok()) return ReportStatus(s, "mount");
  }
  return ReportStatus(fs::RunDaemon(options), "mount");
}

// Reads a virtual attribute of the mount root ("" on failure).
std::string RootAttr(const std::string& mountpoint, const char* name) {
  char buf[64];
  ssize_t n = ::getxattr(mountpoint.c_str(), name, buf, sizeof buf);
  return n < 0 ? std::string() : std::string(buf, static_cast<size_t>(n));
}

// True while `pid` runs. A zombie counts as exited: the daemon was
// reparented when `ckptfs mount` returned, and its new parent may reap late.
bool ProcessAlive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  size_t close_paren = line.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < line.size() && line[close_paren + 2] != 'Z';
}

// Waits until the mount has no commit pending (closed files encoded and
// committed to the store) or `deadline` passes; true when none is left.
bool WaitForCommits(const std::string& mountpoint, std::chrono::steady_clock::time_point deadline) {
  // Commits that wait for something (a DCP shard for its save's .metadata)
  // go ahead now (a daemon that predates this refuses it: it had none).
  (void)::setxattr(mountpoint.c_str(), "user.ckptfs.sync", "1", 1, 0);
  while (true) {
    std::string pending = RootAttr(mountpoint, "user.ckptfs.pending");
    if (pending.empty() || pending == "0") return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int RunSync(const std::string& mountpoint, int timeout_s) {
  if (RootAttr(mountpoint, "user.ckptfs.pid").empty())
    return ReportStatus(Status::InvalidArgument(mountpoint + " is not a ckptfs mount (no user.ckptfs.pid)"), "sync");
  if (!WaitForCommits(mountpoint, std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s)))
    return ReportStatus(Status::Io(ETIMEDOUT, "commits still pending after " + std::to_string(timeout_s) + " s"),
                        "sync");
  return kExitOk;
}

int RunUmount(const std::string& mountpoint, int timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  std::string pid_text = RootAttr(mountpoint, "user.ckptfs.pid");
  if (pid_text.empty())
    return ReportStatus(Status::InvalidArgument(mountpoint + " is not a ckptfs mount (no user.ckptfs.pid)"),
                        "umount");
  // Wait for pending encodes so that the commits finish while the mount
  // still exists (the daemon also drains on exit).
  WaitForCommits(mountpoint, deadline);
  pid_t pid = static_cast<pid_t>(std::stol(pid_text));
  int rc = ::umount2(mountpoint.c_str(), 0);
  // The kernel drops the last references of closed files asynchronously
  // (deferred fput): a brief EBUSY right after the last close is retried.
  for (int tries = 0; rc != 0 && errno == EBUSY && tries < 40; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    rc = ::umount2(mountpoint.c_str(), 0);
  }
  if (rc != 0) {
    int err = errno;
    if (err != EPERM) return ReportStatus(Status::Io(err, "umount " + mountpoint), "umount");
    pid_t child = ::fork();
    if (child == 0) {
      ::execlp("fusermount3", "fusermount3", "-u", mountpoint.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int wstatus = 0;
    ::waitpid(child, &wstatus, 0);
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0)
      return ReportStatus(Status::Io(EIO, "fusermount3 -u " + mountpoint + " failed"), "umount");
  }
  while (ProcessAlive(pid)) {
    if (std::chrono::steady_clock::now() > deadline)
      return ReportStatus(Status::Io(ETIMEDOUT, "daemon " + pid_text + " still running"), "umount");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return kExitOk;
}

}  // namespace

void RegisterMountCommands(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<MountArgs>();
  CLI::App* mount = app.add_subcommand("mount", "Mount BACKING on MOUNTPOINT (daemonizes once mounted)");
  mount->add_option("backing", args->backing, "Backing directory (the store)")->required();
  mount->add_option("mountpoint", args->mountpoint, "Where to mount")->required();
  mount->add_flag("-f,--foreground", args->foreground, "Stay in the foreground");
  mount->add_option("-o", args->option_lists,
                    "Options: level=lossless|safe|default|compact|max (below), staging=auto|store|DIR, threads=N, "
                    "cache=MiB, mem=MiB, log=FILE, loglevel=debug|info|warn|error, gc_grace=S, gc_interval=S, "
                    "allow_other, default_permissions, ro, ... (fs/README.md; the codec's expert options: "
                    "docs/policy.md)")
      ->allow_extra_args(false);
  std::string levels = "Levels (-o level=NAME; the other options given refine it):\n";
  for (const fs::Preset& p : fs::kPresets)
    levels += fmt::format("  {:<9} {}\n            = {}\n", p.name, p.summary, p.options);
  mount->footer(levels);
  mount->callback([args, exit_code] { *exit_code = RunMount(*args); });

  auto target = std::make_shared<std::string>();
  auto timeout = std::make_shared<int>(600);
  CLI::App* umount = app.add_subcommand("umount", "Wait for pending commits, unmount, wait for the daemon");
  umount->add_option("mountpoint", *target, "A ckptfs mountpoint")->required();
  umount->add_option("--timeout", *timeout, "Seconds to wait for commits and the daemon (default 600)");
  umount->callback([target, timeout, exit_code] { *exit_code = RunUmount(*target, *timeout); });

  CLI::App* sync = app.add_subcommand(
      "sync", "Wait until every file closed in the mount is committed to the store (other machines then read it)");
  sync->add_option("mountpoint", *target, "A ckptfs mountpoint")->required();
  sync->add_option("--timeout", *timeout, "Seconds to wait (default 600; exit 3 when commits are still pending)");
  sync->callback([target, timeout, exit_code] { *exit_code = RunSync(*target, *timeout); });
}

// mount(8) runs "mount.ckptfs BACKING MOUNTPOINT [-sfnv] [-o OPTIONS]":
// rewrite that into "ckptfs mount BACKING MOUNTPOINT -o OPTIONS".
std::vector<std::string> MountHelperArgs(int argc, char** argv) {
  std::vector<std::string> out = {"ckptfs", "mount"};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-o" && i + 1 < argc) {
      out.push_back("-o");
      out.push_back(argv[++i]);
    } else if (a == "-s" || a == "-n" || a == "-v") {
      continue;  // sloppy, no-mtab, verbose: nothing to do
    } else {
      out.push_back(a);
    }
  }
  return out;
}

}  // namespace ckptfs::tools
