#include "codec/format/torch_pickle.h"

#include <fmt/format.h>

#include <unordered_map>
#include <unordered_set>

namespace ckptfs {
namespace {

using Kind = PickleNode::Kind;

struct NamedDType {
  std::string_view name;
  DType dtype;
};

// Legacy typed storage classes (what torch 1.x and 2.x write in the
// persistent id) and dtype globals (what an untyped-storage writer may use).
constexpr NamedDType kTorchDTypes[] = {
    {"torch.DoubleStorage", DType::kF64},        {"torch.FloatStorage", DType::kF32},
    {"torch.HalfStorage", DType::kF16},          {"torch.BFloat16Storage", DType::kBF16},
    {"torch.LongStorage", DType::kI64},          {"torch.IntStorage", DType::kI32},
    {"torch.ShortStorage", DType::kI16},         {"torch.CharStorage", DType::kI8},
    {"torch.ByteStorage", DType::kU8},           {"torch.BoolStorage", DType::kBool},
    {"torch.ComplexFloatStorage", DType::kC64},  {"torch.ComplexDoubleStorage", DType::kC128},
    {"torch.float64", DType::kF64},              {"torch.double", DType::kF64},
    {"torch.float32", DType::kF32},              {"torch.float", DType::kF32},
    {"torch.float16", DType::kF16},              {"torch.half", DType::kF16},
    {"torch.bfloat16", DType::kBF16},            {"torch.int64", DType::kI64},
    {"torch.long", DType::kI64},                 {"torch.int32", DType::kI32},
    {"torch.int", DType::kI32},                  {"torch.int16", DType::kI16},
    {"torch.short", DType::kI16},                {"torch.int8", DType::kI8},
    {"torch.uint8", DType::kU8},                 {"torch.bool", DType::kBool},
    {"torch.uint16", DType::kU16},               {"torch.uint32", DType::kU32},
    {"torch.uint64", DType::kU64},               {"torch.complex64", DType::kC64},
    {"torch.cfloat", DType::kC64},               {"torch.complex128", DType::kC128},
    {"torch.cdouble", DType::kC128},             {"torch.complex32", DType::kC32},
    {"torch.chalf", DType::kC32},                {"torch.float8_e4m3fn", DType::kF8E4M3},
    {"torch.float8_e5m2", DType::kF8E5M2},
};

bool IsTensorRebuild(std::string_view callee) {
  return callee == "torch._utils._rebuild_tensor_v2" || callee == "torch._utils._rebuild_tensor";
}
bool IsParameterRebuild(std::string_view callee) {
  return callee == "torch._utils._rebuild_parameter" ||
         callee == "torch._utils._rebuild_parameter_with_state";
}

// Longest key path the walk builds; longer ones are refused (see Walk).
constexpr size_t kMaxPathLength = 16384;

// The dict key of a path component as Python's str() would print it
// (truncated past kMaxPathLength, which the walk refuses anyway).
std::string KeyText(const PickleNode* key) {
  switch (key->kind) {
    case Kind::kString: return key->text.substr(0, kMaxPathLength + 1);
    case Kind::kInt: return key->big_int ? "<int>" : std::to_string(key->int_value);
    case Kind::kBool: return key->bool_value ? "True" : "False";
    case Kind::kNone: return "None";
    case Kind::kFloat: return fmt::format("{}", key->float_value);
    default: return "?";
  }
}

std::string Join(const std::string& path, std::string_view part) {
  if (path.empty()) return std::string(part);
  return path + "." + std::string(part);
}

class StorageFinder {
 public:
  explicit StorageFinder(const ParseLimits& limits) : limits_(limits) {}

  Status Walk(const PickleNode* node, const std::string& path, uint32_t depth) {
    if (node == nullptr || !visited_.insert(node).second) return Status::Ok();
    if (depth > limits_.max_pickle_depth)
      return Status::InvalidArgument(
          fmt::format("pickle: object graph deeper than {}", limits_.max_pickle_depth));
    // Bounds the memory the path strings of the walk can hold at once.
    if (path.size() > kMaxPathLength)
      return Status::InvalidArgument(fmt::format("pickle: key path longer than {} bytes", kMaxPathLength));
    switch (node->kind) {
      case Kind::kDict:
        return WalkEntries(node, path, depth);
      case Kind::kList:
      case Kind::kTuple:
      case Kind::kSet:
        return WalkItems(node->items, path, depth);
      case Kind::kPersistentId:
        return AddStorage(node, path, nullptr);
      case Kind::kCall:
        return WalkCall(node, path, depth);
      default:
        return Status::Ok();
    }
  }

  std::vector<TorchStorage> Take() { return std::move(storages_); }

 private:
  // Only containers, objects and persistent ids can lead to storages, and a
  // node is walked once: checking that before building its path keeps the
  // cost linear even when one long key is reused for many entries.
  bool WorthWalking(const PickleNode* node) const {
    switch (node->kind) {
      case Kind::kDict:
      case Kind::kList:
      case Kind::kTuple:
      case Kind::kSet:
      case Kind::kCall:
      case Kind::kPersistentId:
        return visited_.count(node) == 0;
      default:
        return false;
    }
  }
  Status WalkEntries(const PickleNode* node, const std::string& path, uint32_t depth) {
    for (const auto& [key, value] : node->entries)
      if (WorthWalking(value)) RETURN_IF_ERROR(Walk(value, Join(path, KeyText(key)), depth + 1));
    return Status::Ok();
  }
  Status WalkItems(const std::vector<PickleNode*>& items, const std::string& path, uint32_t depth) {
    for (size_t i = 0; i < items.size(); ++i)
      if (WorthWalking(items[i])) RETURN_IF_ERROR(Walk(items[i], Join(path, std::to_string(i)), depth + 1));
    return Status::Ok();
  }

  Status WalkCall(const PickleNode* node, const std::string& path, uint32_t depth) {
    std::string_view callee = node->CalleeName();
    const PickleNode* args = node->args;
    bool has_args = args != nullptr && args->kind == Kind::kTuple;
    if (has_args && IsTensorRebuild(callee)) return AddTensor(args, path, depth);
    if (has_args && IsParameterRebuild(callee) && !args->items.empty())
      return Walk(args->items[0], path, depth + 1);
    // Tensor subclasses: _rebuild_from_type_v2(func, type, args, state).
    if (has_args && callee == "torch._tensor._rebuild_from_type_v2" && args->items.size() >= 3 &&
        args->items[0]->kind == Kind::kGlobal && IsTensorRebuild(args->items[0]->text) &&
        args->items[2]->kind == Kind::kTuple)
      return AddTensor(args->items[2], path, depth);
    // Any other object (OrderedDict included): its items as a dict's, its
    // list items by index, its BUILD state as attributes, then its arguments.
    RETURN_IF_ERROR(WalkEntries(node, path, depth));
    RETURN_IF_ERROR(WalkItems(node->items, path, depth));
    if (node->state != nullptr) {
      if (node->state->kind == Kind::kDict && visited_.insert(node->state).second) {
        RETURN_IF_ERROR(WalkEntries(node->state, path, depth));
      } else {
        RETURN_IF_ERROR(Walk(node->state, path, depth + 1));
      }
    }
    if (has_args) RETURN_IF_ERROR(WalkItems(args->items, path, depth));
    return Status::Ok();
  }

  // args of _rebuild_tensor_v2: (storage, storage_offset, size, stride, ...).
  Status AddTensor(const PickleNode* args, const std::string& path, uint32_t depth) {
    if (args->items.size() < 4 || args->items[0]->kind != Kind::kPersistentId)
      return WalkItems(args->items, path, depth);  // not a form we know: look inside
    visited_.insert(args->items[0]);
    return AddStorage(args->items[0], path, args);
  }

  Status AddStorage(const PickleNode* pid_node, const std::string& path, const PickleNode* view) {
    const PickleNode* pid = pid_node->args;
    // ('storage', storage_type, key, location, numel)
    if (pid == nullptr || pid->kind != Kind::kTuple || pid->items.size() < 5 || !pid->items[0]->IsString() ||
        pid->items[0]->text != "storage")
      return Status::Corruption("pickle: persistent id is not ('storage', type, key, location, numel)");
    const PickleNode* key_node = pid->items[2];
    const PickleNode* numel_node = pid->items[4];
    if (!(key_node->IsString() || key_node->IsInt()) || !numel_node->IsInt() || numel_node->int_value < 0)
      return Status::Corruption("pickle: persistent id has a bad key or element count");
    std::string key = KeyText(key_node);
    if (index_.count(key) != 0) return Status::Ok();  // already named by an earlier view
    if (storages_.size() >= limits_.max_tensors)
      return Status::InvalidArgument(fmt::format("pickle: more than {} storages", limits_.max_tensors));
    TorchStorage s;
    s.key = key;
    s.numel = static_cast<uint64_t>(numel_node->int_value);
    const PickleNode* type = pid->items[1];
    if (type->kind == Kind::kGlobal) s.dtype = TorchDTypeFromGlobal(type->text);
    s.name = path.empty() ? "tensor" : path;
    s.shape = {s.numel};
    if (view != nullptr) {
      std::vector<uint64_t> shape;
      if (WholeContiguousView(view, s.numel, &shape)) s.shape = std::move(shape);
    }
    index_[key] = storages_.size();
    storages_.push_back(std::move(s));
    return Status::Ok();
  }

  // True if the view (offset, size, stride) is row-major contiguous from
  // offset 0 and covers all `numel` elements; then `shape` is its size.
  static bool WholeContiguousView(const PickleNode* args, uint64_t numel, std::vector<uint64_t>* shape) {
    const PickleNode* offset = args->items[1];
    const PickleNode* size = args->items[2];
    const PickleNode* stride = args->items[3];
    if (!offset->IsInt() || offset->int_value != 0 || !size->IsSequence() || !stride->IsSequence() ||
        size->items.size() != stride->items.size())
      return false;
    uint64_t product = 1;
    for (const PickleNode* d : size->items) {
      if (!d->IsInt() || d->int_value < 0) return false;
      if (__builtin_mul_overflow(product, static_cast<uint64_t>(d->int_value), &product)) return false;
      shape->push_back(static_cast<uint64_t>(d->int_value));
    }
    if (product != numel) return false;
    // Row-major: stride[i] == product of later sizes, ignoring dims of size 1
    // (their stride is arbitrary, as torch's is_contiguous also holds).
    uint64_t expect = 1;
    for (size_t i = shape->size(); i-- > 0;) {
      if ((*shape)[i] == 1) continue;
      const PickleNode* st = stride->items[i];
      if (!st->IsInt() || static_cast<uint64_t>(st->int_value) != expect) return false;
      expect *= (*shape)[i];
    }
    return true;
  }

  const ParseLimits& limits_;
  std::unordered_set<const PickleNode*> visited_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<TorchStorage> storages_;
};

}  // namespace

DType TorchDTypeFromGlobal(std::string_view name) {
  for (const NamedDType& d : kTorchDTypes)
    if (d.name == name) return d.dtype;
  return DType::kUnknown;
}

Result<std::vector<TorchStorage>> FindTorchStorages(const PickleGraph& graph, const ParseLimits& limits) {
  StorageFinder finder(limits);
  RETURN_IF_ERROR(finder.Walk(graph.root(), "", 0));
  return finder.Take();
}

}  // namespace ckptfs
