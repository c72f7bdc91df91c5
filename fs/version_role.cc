#include "fs/version_role.h"

#include <algorithm>
#include <array>
#include <cctype>

namespace ckptfs::fs {

namespace {

// Stands for a step number (or a random staging token) in a normalized
// name. A control character: real file names practically never hold it,
// and a false match would only offer a wrong delta base, which costs bytes,
// never correctness (the encoder measures errors against the file's own
// values and ignores a base that shares no tensors).
constexpr char kWild = '\x1f';

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsAlnum(char c) { return IsDigit(c) || IsAlpha(c); }
bool IsSeparator(char c) { return c == '_' || c == '-' || c == '='; }

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Whether the word ending right before `pos` (one separator allowed in
// between) names a rank or a shard.
bool AfterRankWord(std::string_view s, size_t pos) {
  size_t end = pos;
  if (end > 0 && IsSeparator(s[end - 1])) --end;
  size_t begin = end;
  while (begin > 0 && IsAlpha(s[begin - 1])) --begin;
  if (begin == end) return false;
  static constexpr std::array<std::string_view, 18> kWords = {
      "rank", "shard", "part", "expert", "layer", "worker", "node", "gpu", "device",
      "proc", "process", "tp", "pp", "dp", "ep", "mp", "fsdp", "optimizer"};
  const std::string word = Lower(s.substr(begin, end - begin));
  if (std::find(kWords.begin(), kWords.end(), word) != kWords.end()) return true;
  // rng_state_{i}: one file per process in a Trainer's folder.
  return word == "state" && begin >= 4 && Lower(s.substr(begin - 4, 4)) == "rng_";
}

struct DigitRun {
  size_t begin, end;
  bool identity;
};

std::vector<DigitRun> DigitRuns(std::string_view s) {
  std::vector<DigitRun> runs;
  for (size_t i = 0; i < s.size();) {
    if (!IsDigit(s[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && IsDigit(s[j])) ++j;
    runs.push_back({i, j, false});
    i = j;
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    DigitRun& run = runs[r];
    bool id = AfterRankWord(s, run.begin);
    // mp_rank_00_001: a pipeline rank right after a tensor-parallel rank.
    if (!id && r > 0 && runs[r - 1].identity && run.begin == runs[r - 1].end + 1 &&
        (s[run.begin - 1] == '_' || s[run.begin - 1] == '-'))
      id = true;
    // model-00002-of-00005: a shard and the shard count.
    if (s.substr(run.end).starts_with("-of-") && run.end + 4 < s.size() && IsDigit(s[run.end + 4])) id = true;
    if (run.begin >= 5 && s.substr(run.begin - 4, 4) == "-of-" && IsDigit(s[run.begin - 5])) id = true;
    run.identity = id;
  }
  // __R_k.distcp (DCP): the rank and the writer thread.
  if (s.ends_with(".distcp") && runs.size() >= 2) {
    DigitRun& k = runs[runs.size() - 1];
    DigitRun& rank = runs[runs.size() - 2];
    const size_t dot = s.size() - 7;
    if (k.end == dot && rank.end + 1 == k.begin && s[rank.end] == '_' && rank.begin >= 2 &&
        s.substr(rank.begin - 2, 2) == "__")
      rank.identity = k.identity = true;
  }
  return runs;
}

bool IsTokenChar(char c) { return IsAlnum(c) || c == '_'; }

}  // namespace

std::string NormalizeComponent(std::string_view name, bool blind_ranks) {
  // A temporary name as a whole: tmpXXXXXXXX (mkstemp), .tmpXXXXXX.
  {
    std::string_view rest = name.starts_with(".tmp") ? name.substr(4) : name.starts_with("tmp") ? name.substr(3) : "";
    if (rest.size() >= 6 && std::all_of(rest.begin(), rest.end(), IsTokenChar)) return std::string(1, kWild) + "tmp";
  }
  std::string_view s = name;
  bool staged = false;
  for (std::string_view prefix : {"tmp-", "tmp_", ".tmp-", ".tmp_", "temp-", "temp_"}) {
    if (s.size() > prefix.size() && Lower(s.substr(0, prefix.size())) == prefix) {
      s.remove_prefix(prefix.size());
      staged = true;
      break;
    }
  }
  for (std::string_view suffix : {".tmp", "-tmp", "_tmp", ".temp"}) {
    if (s.size() > suffix.size() && Lower(s.substr(s.size() - suffix.size())) == suffix) {
      s.remove_suffix(suffix.size());
      staged = true;
      break;
    }
  }
  // After a staging prefix, a random last token (TemporaryDirectory's
  // eight letters, digits and underscores) stands for the step.
  size_t random_from = s.size();
  if (staged) {
    const size_t dash = s.rfind('-');
    const size_t from = dash == std::string_view::npos ? 0 : dash + 1;
    std::string_view token = s.substr(from);
    if (token.size() >= 6 && std::all_of(token.begin(), token.end(), IsTokenChar) &&
        std::any_of(token.begin(), token.end(), IsDigit))
      random_from = from;
  }
  std::string out;
  out.reserve(s.size());
  const std::vector<DigitRun> runs = DigitRuns(s.substr(0, random_from));
  size_t pos = 0;
  for (const DigitRun& run : runs) {
    out.append(s.substr(pos, run.begin - pos));
    if (run.identity && !blind_ranks) out.append(s.substr(run.begin, run.end - run.begin));
    else out.push_back(kWild);
    pos = run.end;
  }
  out.append(s.substr(pos, random_from - pos));
  if (random_from < s.size()) out.push_back(kWild);
  return out;
}

std::vector<unsigned long long> ComponentNumbers(std::string_view name) {
  std::vector<unsigned long long> out;
  for (size_t i = 0; i < name.size();) {
    if (!IsDigit(name[i])) {
      ++i;
      continue;
    }
    unsigned long long v = 0;
    int digits = 0;
    for (; i < name.size() && IsDigit(name[i]); ++i)
      if (++digits <= 18) v = v * 10 + static_cast<unsigned long long>(name[i] - '0');
    out.push_back(v);
  }
  return out;
}

FileRole RoleOf(std::string_view rel_path) {
  FileRole role;
  std::vector<std::string_view> parts;
  for (size_t pos = 0; pos <= rel_path.size();) {
    size_t slash = rel_path.find('/', pos);
    if (slash == std::string_view::npos) slash = rel_path.size();
    if (slash > pos) parts.push_back(rel_path.substr(pos, slash - pos));
    pos = slash + 1;
  }
  if (parts.empty()) return role;
  const size_t n = parts.size();
  std::vector<std::string> normalized(n);
  for (size_t i = 0; i < n; ++i) normalized[i] = NormalizeComponent(parts[i]);
  // The step component: the file name when it carries the step
  // (ckpt-000200.pt, epoch=3-step=1200.ckpt), else the deepest directory
  // that normalizes differently.
  size_t step = n;
  if (normalized[n - 1].find(kWild) != std::string::npos) {
    step = n - 1;
  } else {
    for (size_t i = n - 1; i-- > 0;)
      if (normalized[i] != parts[i]) {
        step = i;
        break;
      }
  }
  role.text.resize(n);
  role.pattern.assign(n, false);
  // A folder above the step component changes with it when its numbers are
  // the step's (largest) number: checkpoint-100/global_step100/,
  // step-100/ckpt-100.pt. A seed0/ above epoch=0-step=100.ckpt does not.
  unsigned long long step_number = 0;
  if (step < n) {
    const std::vector<unsigned long long> numbers = ComponentNumbers(parts[step]);
    if (!numbers.empty()) step_number = *std::max_element(numbers.begin(), numbers.end());
  }
  for (size_t i = 0; i < n; ++i) {
    // The file name is matched by its normalized name also when that only
    // drops a staging marker (.metadata.tmp).
    bool pattern = i == step || (i == n - 1 && normalized[i] != parts[i]);
    if (!pattern && i < step && step < n && normalized[i] != parts[i]) {
      const std::vector<unsigned long long> mine = ComponentNumbers(parts[i]);
      pattern = !mine.empty() &&
                std::all_of(mine.begin(), mine.end(), [&](unsigned long long v) { return v == step_number; });
    }
    role.pattern[i] = pattern;
    role.text[i] = pattern ? normalized[i] : std::string(parts[i]);
    if (i > 0) role.key.push_back('/'), role.rank_blind.push_back('/');
    role.key.append(role.text[i]);
    role.rank_blind.append(NormalizeComponent(parts[i], /*blind_ranks=*/true));
  }
  return role;
}

}  // namespace ckptfs::fs
