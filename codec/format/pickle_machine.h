// A bounded, non-executing pickle interpreter. It turns a pickle (protocols
// 0-5 binary opcodes, as torch.save and numpy write them) into an object
// graph in which imported callables stay symbolic: GLOBAL gives a node naming
// "module.name", REDUCE/NEWOBJ give a call node holding the callable and its
// arguments, BINPERSID gives a persistent-id node. Nothing is ever imported
// or run, so a hostile pickle can cost at most the ParseLimits.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "codec/common/bytes.h"
#include "codec/common/status.h"
#include "codec/format/layout.h"

namespace ckptfs {

// One value of the object graph. Nodes are owned by their PickleGraph and
// refer to each other by raw pointer (the graph may contain cycles).
struct PickleNode {
  enum class Kind : uint8_t {
    kNone,
    kBool,
    kInt,       // int_value; big_int set when it does not fit in int64
    kFloat,
    kString,    // text (utf-8), in `text`
    kBytes,     // bytes/bytearray, in `text`
    kList,      // items
    kTuple,     // items
    kDict,      // entries
    kSet,       // items (set or frozenset)
    kGlobal,    // text = "module.name"
    kCall,      // callable + args (a tuple node); entries/items/state filled
                // by SETITEM(S)/APPEND(S)/BUILD applied to the result
    kPersistentId,  // args = the persistent id value
  };

  Kind kind = Kind::kNone;
  bool bool_value = false;
  bool big_int = false;
  int64_t int_value = 0;
  double float_value = 0;
  std::string text;
  std::vector<PickleNode*> items;
  std::vector<std::pair<PickleNode*, PickleNode*>> entries;
  PickleNode* callable = nullptr;  // kCall
  PickleNode* args = nullptr;      // kCall: a tuple; kPersistentId: the pid
  PickleNode* state = nullptr;     // kCall: BUILD state, when any

  bool IsString() const { return kind == Kind::kString; }
  bool IsInt() const { return kind == Kind::kInt && !big_int; }
  bool IsSequence() const { return kind == Kind::kTuple || kind == Kind::kList; }
  // True if this is a GLOBAL node naming exactly `name` ("module.name").
  bool IsGlobal(std::string_view name) const { return kind == Kind::kGlobal && text == name; }
  // For a call: the name of its callable when that is a GLOBAL, else "".
  std::string_view CalleeName() const;
};

// The result of running a pickle: the value STOP returned, plus ownership of
// every node. Movable, not copyable; not thread-safe to mutate.
class PickleGraph {
 public:
  PickleGraph() = default;
  PickleGraph(PickleGraph&&) = default;
  PickleGraph& operator=(PickleGraph&&) = default;

  PickleNode* root() const { return root_; }
  size_t node_count() const { return nodes_.size(); }

 private:
  friend class PickleMachine;
  PickleNode* root_ = nullptr;
  std::vector<std::unique_ptr<PickleNode>> nodes_;
};

// Runs `pickle` up to its STOP opcode. Corruption when the pickle is
// malformed (stack underflow, bad memo index, truncated operand, data after
// nothing to return); Unsupported for an opcode it does not implement;
// InvalidArgument when a ParseLimits bound (bytes, ops, memo, mark depth)
// is exceeded. Thread-safe (no shared state).
Result<PickleGraph> RunPickle(ByteSpan pickle, const ParseLimits& limits);

}  // namespace ckptfs
