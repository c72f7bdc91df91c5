#include "codec/format/pickle_machine.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <unordered_map>

namespace ckptfs {

std::string_view PickleNode::CalleeName() const {
  if (kind != Kind::kCall || callable == nullptr || callable->kind != Kind::kGlobal) return {};
  return callable->text;
}

// The interpreter state of one RunPickle call. Stack entries are node
// pointers; MARK pushes the current stack height onto `marks_`.
class PickleMachine {
 public:
  PickleMachine(ByteSpan pickle, const ParseLimits& limits)
      : in_(pickle, "pickle"), limits_(limits) {}

  Result<PickleGraph> Run();

 private:
  using Kind = PickleNode::Kind;

  PickleNode* New(Kind kind) {
    graph_.nodes_.push_back(std::make_unique<PickleNode>());
    graph_.nodes_.back()->kind = kind;
    return graph_.nodes_.back().get();
  }
  Status Push(PickleNode* node) {
    stack_.push_back(node);
    return Status::Ok();
  }
  Result<PickleNode*> Pop() {
    if (stack_.size() <= StackFloor()) return Underflow();
    PickleNode* n = stack_.back();
    stack_.pop_back();
    return n;
  }
  Result<PickleNode*> Top() {
    if (stack_.size() <= StackFloor()) return Underflow();
    return stack_.back();
  }
  size_t StackFloor() const { return marks_.empty() ? 0 : marks_.back(); }
  Status Underflow() const {
    return Status::Corruption(fmt::format("pickle: stack underflow at offset {}", op_offset_));
  }
  // Pops everything above the innermost MARK, and the mark itself.
  Result<std::vector<PickleNode*>> PopMark() {
    if (marks_.empty())
      return Status::Corruption(fmt::format("pickle: no MARK for the opcode at offset {}", op_offset_));
    size_t from = marks_.back();
    marks_.pop_back();
    std::vector<PickleNode*> items(stack_.begin() + static_cast<std::ptrdiff_t>(from), stack_.end());
    stack_.resize(from);
    return items;
  }
  Status Memoize(uint64_t index, PickleNode* node) {
    if (index >= limits_.max_pickle_memo || memo_.size() >= limits_.max_pickle_memo)
      return Status::InvalidArgument(
          fmt::format("pickle: memo index {} over the limit {}", index, limits_.max_pickle_memo));
    memo_[index] = node;
    return Status::Ok();
  }
  Status Recall(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end())
      return Status::Corruption(fmt::format("pickle: memo index {} was never stored", index));
    return Push(it->second);
  }
  Status PushText(Kind kind, uint64_t length) {
    ByteSpan bytes = in_.Bytes(length);
    RETURN_IF_ERROR(in_.status());
    PickleNode* n = New(kind);
    n->text.assign(AsChars(bytes));
    return Push(n);
  }
  Status PushInt(int64_t v) {
    PickleNode* n = New(Kind::kInt);
    n->int_value = v;
    return Push(n);
  }
  // LONG1/LONG4: little-endian two's complement of `length` bytes.
  Status PushLong(uint64_t length) {
    ByteSpan bytes = in_.Bytes(length);
    RETURN_IF_ERROR(in_.status());
    PickleNode* n = New(Kind::kInt);
    if (length > 8) {
      n->big_int = true;
      return Push(n);
    }
    uint64_t v = 0;
    for (size_t i = length; i-- > 0;) v = (v << 8) | static_cast<uint64_t>(bytes[i]);
    if (length > 0 && length < 8 && (static_cast<uint8_t>(bytes[length - 1]) & 0x80) != 0)
      v |= ~uint64_t{0} << (8 * length);  // sign-extend
    n->int_value = static_cast<int64_t>(v);
    return Push(n);
  }
  Status PushTuple(std::vector<PickleNode*> items) {
    PickleNode* n = New(Kind::kTuple);
    n->items = std::move(items);
    return Push(n);
  }
  Status PushTupleOf(size_t count) {
    if (stack_.size() < StackFloor() + count) return Underflow();
    std::vector<PickleNode*> items(stack_.end() - static_cast<std::ptrdiff_t>(count), stack_.end());
    stack_.resize(stack_.size() - count);
    return PushTuple(std::move(items));
  }
  Status PushGlobal(std::string module, std::string name) {
    PickleNode* n = New(Kind::kGlobal);
    n->text = std::move(module) + "." + std::move(name);
    return Push(n);
  }
  // GLOBAL's operands are two newline-terminated lines.
  Result<std::string> ReadLine() {
    std::string line;
    while (true) {
      uint8_t c = in_.U8();
      RETURN_IF_ERROR(in_.status());
      if (c == '\n') return line;
      if (line.size() >= 4096) return Status::Corruption("pickle: GLOBAL name longer than 4096 bytes");
      line.push_back(static_cast<char>(c));
    }
  }
  Status MakeCall(PickleNode* callable, PickleNode* args) {
    PickleNode* n = New(Kind::kCall);
    n->callable = callable;
    n->args = args;
    return Push(n);
  }
  Status SetItems(PickleNode* target, const std::vector<PickleNode*>& kv) {
    if (kv.size() % 2 != 0) return Status::Corruption("pickle: SETITEMS with an odd number of values");
    if (target->kind != Kind::kDict && target->kind != Kind::kCall)
      return Status::Corruption("pickle: SETITEM(S) on a value that is not a dict or an object");
    for (size_t i = 0; i < kv.size(); i += 2) target->entries.emplace_back(kv[i], kv[i + 1]);
    return Status::Ok();
  }
  Status Append(PickleNode* target, const std::vector<PickleNode*>& values, Kind want) {
    if (target->kind != want && target->kind != Kind::kCall)
      return Status::Corruption("pickle: APPEND(S)/ADDITEMS on a value of the wrong kind");
    target->items.insert(target->items.end(), values.begin(), values.end());
    return Status::Ok();
  }

  Status Step(uint8_t op);

  ByteReader in_;
  const ParseLimits& limits_;
  PickleGraph graph_;
  std::vector<PickleNode*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PickleNode*> memo_;
  size_t op_offset_ = 0;
  bool stopped_ = false;
};

Status PickleMachine::Step(uint8_t op) {
  switch (op) {
    case 0x80:  // PROTO
      if (in_.U8() > 5) return Status::Unsupported("pickle: protocol above 5");
      return in_.status();
    case 0x95:  // FRAME: a length prefix only; frames are read inline
      in_.Skip(8);
      return in_.status();
    case '.': {  // STOP
      ASSIGN_OR_RETURN(graph_.root_, Pop());
      stopped_ = true;
      return Status::Ok();
    }
    case '(':
      if (marks_.size() >= limits_.max_pickle_depth)
        return Status::InvalidArgument(
            fmt::format("pickle: more than {} nested MARKs", limits_.max_pickle_depth));
      marks_.push_back(stack_.size());
      return Status::Ok();
    case '0': return Pop().status();  // POP
    case '1': return PopMark().status();  // POP_MARK
    case '2': {  // DUP
      ASSIGN_OR_RETURN(PickleNode * top, Top());
      return Push(top);
    }
    case 'N': return Push(New(Kind::kNone));
    case 0x88:
    case 0x89: {  // NEWTRUE / NEWFALSE
      PickleNode* n = New(Kind::kBool);
      n->bool_value = op == 0x88;
      return Push(n);
    }
    case 'J': {
      int32_t v = static_cast<int32_t>(in_.U32());
      RETURN_IF_ERROR(in_.status());
      return PushInt(v);
    }
    case 'K': {
      uint8_t v = in_.U8();
      RETURN_IF_ERROR(in_.status());
      return PushInt(v);
    }
    case 'M': {
      uint16_t v = in_.U16();
      RETURN_IF_ERROR(in_.status());
      return PushInt(v);
    }
    case 0x8a: {  // LONG1
      uint8_t n = in_.U8();
      RETURN_IF_ERROR(in_.status());
      return PushLong(n);
    }
    case 0x8b: {  // LONG4
      uint32_t n = in_.U32();
      RETURN_IF_ERROR(in_.status());
      return PushLong(n);
    }
    case 'G': {  // BINFLOAT: big-endian IEEE double
      ByteSpan b = in_.Bytes(8);
      RETURN_IF_ERROR(in_.status());
      uint64_t bits = 0;
      for (std::byte x : b) bits = (bits << 8) | static_cast<uint64_t>(x);
      PickleNode* n = New(Kind::kFloat);
      n->float_value = std::bit_cast<double>(bits);
      return Push(n);
    }
    case 'X': {
      uint32_t n = in_.U32();
      RETURN_IF_ERROR(in_.status());
      return PushText(Kind::kString, n);
    }
    case 0x8c: {  // SHORT_BINUNICODE
      uint8_t n = in_.U8();
      RETURN_IF_ERROR(in_.status());
      return PushText(Kind::kString, n);
    }
    case 0x8d: {  // BINUNICODE8
      uint64_t n = in_.U64();
      RETURN_IF_ERROR(in_.status());
      return PushText(Kind::kString, n);
    }
    case 'T': {  // BINSTRING (python 2 str)
      uint32_t n = in_.U32();
      RETURN_IF_ERROR(in_.status());
      return PushText(Kind::kString, n);
    }
    case 'U': {  // SHORT_BINSTRING
      uint8_t n = in_.U8();
      RETURN_IF_ERROR(in_.status());
      return PushText(Kind::kString, n);
    }
    case 'B': {
      uint32_t n = in_.U32();
      RETURN_IF_ERROR(in_.status());
      return PushText(Kind::kBytes, n);
    }
    case 'C': {
      uint8_t n = in_.U8();
      RETURN_IF_ERROR(in_.status());
      return PushText(Kind::kBytes, n);
    }
    case 0x8e:
    case 0x96: {  // BINBYTES8 / BYTEARRAY8
      uint64_t n = in_.U64();
      RETURN_IF_ERROR(in_.status());
      return PushText(Kind::kBytes, n);
    }
    case '}': return Push(New(Kind::kDict));
    case ']': return Push(New(Kind::kList));
    case ')': return PushTuple({});
    case 0x8f: return Push(New(Kind::kSet));  // EMPTY_SET
    case 'd': {  // DICT
      ASSIGN_OR_RETURN(auto kv, PopMark());
      PickleNode* n = New(Kind::kDict);
      RETURN_IF_ERROR(SetItems(n, kv));
      return Push(n);
    }
    case 'l': {  // LIST
      ASSIGN_OR_RETURN(auto items, PopMark());
      PickleNode* n = New(Kind::kList);
      n->items = std::move(items);
      return Push(n);
    }
    case 't': {
      ASSIGN_OR_RETURN(auto items, PopMark());
      return PushTuple(std::move(items));
    }
    case 0x85: return PushTupleOf(1);
    case 0x86: return PushTupleOf(2);
    case 0x87: return PushTupleOf(3);
    case 0x91: {  // FROZENSET
      ASSIGN_OR_RETURN(auto items, PopMark());
      PickleNode* n = New(Kind::kSet);
      n->items = std::move(items);
      return Push(n);
    }
    case 's': {  // SETITEM
      ASSIGN_OR_RETURN(PickleNode * value, Pop());
      ASSIGN_OR_RETURN(PickleNode * key, Pop());
      ASSIGN_OR_RETURN(PickleNode * target, Top());
      return SetItems(target, {key, value});
    }
    case 'u': {  // SETITEMS
      ASSIGN_OR_RETURN(auto kv, PopMark());
      ASSIGN_OR_RETURN(PickleNode * target, Top());
      return SetItems(target, kv);
    }
    case 'a': {  // APPEND
      ASSIGN_OR_RETURN(PickleNode * value, Pop());
      ASSIGN_OR_RETURN(PickleNode * target, Top());
      return Append(target, {value}, Kind::kList);
    }
    case 'e': {  // APPENDS
      ASSIGN_OR_RETURN(auto values, PopMark());
      ASSIGN_OR_RETURN(PickleNode * target, Top());
      return Append(target, values, Kind::kList);
    }
    case 0x90: {  // ADDITEMS
      ASSIGN_OR_RETURN(auto values, PopMark());
      ASSIGN_OR_RETURN(PickleNode * target, Top());
      return Append(target, values, Kind::kSet);
    }
    case 'q': {
      uint8_t i = in_.U8();
      RETURN_IF_ERROR(in_.status());
      ASSIGN_OR_RETURN(PickleNode * top, Top());
      return Memoize(i, top);
    }
    case 'r': {
      uint32_t i = in_.U32();
      RETURN_IF_ERROR(in_.status());
      ASSIGN_OR_RETURN(PickleNode * top, Top());
      return Memoize(i, top);
    }
    case 0x94: {  // MEMOIZE: the next free index
      ASSIGN_OR_RETURN(PickleNode * top, Top());
      return Memoize(memo_.size(), top);
    }
    case 'h': {
      uint8_t i = in_.U8();
      RETURN_IF_ERROR(in_.status());
      return Recall(i);
    }
    case 'j': {
      uint32_t i = in_.U32();
      RETURN_IF_ERROR(in_.status());
      return Recall(i);
    }
    case 'c': {  // GLOBAL "module\nname\n"
      ASSIGN_OR_RETURN(std::string module, ReadLine());
      ASSIGN_OR_RETURN(std::string name, ReadLine());
      return PushGlobal(std::move(module), std::move(name));
    }
    case 0x93: {  // STACK_GLOBAL
      ASSIGN_OR_RETURN(PickleNode * name, Pop());
      ASSIGN_OR_RETURN(PickleNode * module, Pop());
      if (!name->IsString() || !module->IsString())
        return Status::Corruption("pickle: STACK_GLOBAL operands are not strings");
      return PushGlobal(module->text, name->text);
    }
    case 'R': {  // REDUCE
      ASSIGN_OR_RETURN(PickleNode * args, Pop());
      ASSIGN_OR_RETURN(PickleNode * callable, Pop());
      return MakeCall(callable, args);
    }
    case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
      ASSIGN_OR_RETURN(PickleNode * args, Pop());
      ASSIGN_OR_RETURN(PickleNode * cls, Pop());
      return MakeCall(cls, args);
    }
    case 0x92: {  // NEWOBJ_EX: kwargs are dropped; they never name tensors
      ASSIGN_OR_RETURN(PickleNode * kwargs, Pop());
      (void)kwargs;
      ASSIGN_OR_RETURN(PickleNode * args, Pop());
      ASSIGN_OR_RETURN(PickleNode * cls, Pop());
      return MakeCall(cls, args);
    }
    case 'b': {  // BUILD
      ASSIGN_OR_RETURN(PickleNode * state, Pop());
      ASSIGN_OR_RETURN(PickleNode * target, Top());
      // State on a plain value is legal pickle (setstate on any object), but
      // only objects keep it: there is nothing to name inside the others.
      if (target->kind == Kind::kCall) target->state = state;
      return Status::Ok();
    }
    case 'Q': {  // BINPERSID
      ASSIGN_OR_RETURN(PickleNode * pid, Pop());
      PickleNode* n = New(Kind::kPersistentId);
      n->args = pid;
      return Push(n);
    }
    default:
      return Status::Unsupported(
          fmt::format("pickle: unsupported opcode 0x{:02x} at offset {}", op, op_offset_));
  }
}

Result<PickleGraph> PickleMachine::Run() {
  uint64_t ops = 0;
  while (!stopped_) {
    if (++ops > limits_.max_pickle_ops)
      return Status::InvalidArgument(fmt::format("pickle: more than {} opcodes", limits_.max_pickle_ops));
    op_offset_ = in_.position();
    uint8_t op = in_.U8();
    if (!in_.ok()) return Status::Corruption("pickle: ends without a STOP opcode");
    RETURN_IF_ERROR(Step(op));
  }
  return std::move(graph_);
}

Result<PickleGraph> RunPickle(ByteSpan pickle, const ParseLimits& limits) {
  if (pickle.size() > limits.max_pickle_bytes)
    return Status::InvalidArgument(
        fmt::format("pickle: {} bytes, over the limit {}", pickle.size(), limits.max_pickle_bytes));
  PickleMachine machine(pickle, limits);
  return machine.Run();
}

}  // namespace ckptfs
