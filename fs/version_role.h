// The role of a checkpoint file: what stays the same from one save of a
// training run to the next, so that the previous version of a file is found
// wherever the framework put it (fs/README.md, "Which version is the base").
//
// Frameworks change one thing between saves: the step, in a folder name
// (`checkpoint-200/`, `iter_0000200/`, `global_step200/`, `step-200/`) or in
// the file name (`epoch=3-step=1200.ckpt`, `ckpt-000200.pt`), often staged
// under a temporary name first (`tmp-checkpoint-200/`, `.metadata.tmp`).
// Rank and shard numbers (`mp_rank_03`, `zero_pp_rank_1`, `__1_0.distcp`,
// `model-00002-of-00005`) do not change: they say which file of a save it
// is. The role of a path keeps everything but the step:
//  - each component is normalized: staging markers dropped (prefixes
//    `tmp-` `tmp_` `.tmp-` `.tmp_` `temp-` `temp_`, suffixes `.tmp` `-tmp`
//    `_tmp` `.temp`; a name that is `tmp`/`.tmp` plus six or more letters
//    or digits is a temporary name as a whole), and every run of digits
//    that is not a rank or shard number becomes a wildcard; after a staging
//    prefix, a last token of six or more letters/digits (a random suffix)
//    is a wildcard too;
//  - a digit run is a rank or shard number when the word before it (one
//    `_`, `-` or `=` in between allowed) is rank, shard, part, expert,
//    layer, worker, node, gpu, device, proc, process, tp, pp, dp, ep, mp,
//    fsdp, optimizer (accelerate's pytorch_model_fsdp_0/) or rng_state,
//    when it follows such a number after one `_`/`-` (`mp_rank_00_001`),
//    when it is either side of `-of-`, or when it is R or k of a DCP file
//    name `__R_k.distcp`;
//  - the *step component* is the file name when its normalized name has a
//    wildcard (`ckpt-000200.pt`), else the deepest directory whose
//    normalized name differs from its name. It is matched by its normalized
//    name, and so is every directory above it whose numbers all equal the
//    step's largest number (`checkpoint-100/global_step100/`), and the file
//    name. Every other directory is matched by its exact name, so two runs
//    in sibling folders (`run1/`, `run2/`, `seed0/`) never share a role.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ckptfs::fs {

struct FileRole {
  // The role: equal for the versions of one file of a run. Empty for an
  // empty path.
  std::string key;
  // The role with rank and shard numbers wildcarded as well: equal for the
  // files of the ranks of one save (used to keep another rank's file, in
  // the same folder, from being a base).
  std::string rank_blind;
  // Per path component: the text to match. A literal component is matched
  // by name; a pattern (`pattern[i]`) by its normalized name
  // (NormalizeComponent(name) == text).
  std::vector<std::string> text;
  std::vector<bool> pattern;
};

// The normalized form of one path component (see above); with
// `blind_ranks`, rank and shard numbers are wildcards too.
std::string NormalizeComponent(std::string_view name, bool blind_ranks = false);

// The role of `rel_path` (relative to the mount root, '/'-separated).
FileRole RoleOf(std::string_view rel_path);

// The folder part of a path relative to the mount root ("" at the root).
inline std::string_view FolderOf(std::string_view rel_path) {
  const size_t slash = rel_path.rfind('/');
  return slash == std::string_view::npos ? std::string_view() : rel_path.substr(0, slash);
}

// The numbers of a component, in order (digit runs as values; runs longer
// than 18 digits saturate): orders sibling step folders, newest step first.
std::vector<unsigned long long> ComponentNumbers(std::string_view name);

}  // namespace ckptfs::fs
