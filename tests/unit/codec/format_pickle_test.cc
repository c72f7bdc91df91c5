// The bounded pickle machine and the torch storage finder, on hand-written
// pickles (each opcode spelled out) and hostile ones.
#include <gtest/gtest.h>

#include "codec/format/pickle_machine.h"
#include "codec/format/torch_pickle.h"
#include "tests/unit/codec/format_test_util.h"

namespace ckptfs {
namespace {

using testing::Bytes;
using Kind = PickleNode::Kind;

// Pickle spelling helpers: each returns the bytes of one opcode and its
// operands, so no test depends on hex escapes inside string literals.
std::string Op(uint8_t op) { return std::string(1, static_cast<char>(op)); }
std::string Le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}
std::string Str(std::string_view text) { return "X" + Le32(static_cast<uint32_t>(text.size())) + std::string(text); }
std::string Int1(uint8_t v) { return "K" + Op(v); }
std::string Put(uint8_t i) { return "q" + Op(i); }
std::string Get(uint8_t i) { return "h" + Op(i); }
const std::string kProto2 = Op(0x80) + Op(2);
const std::string kTuple1 = Op(0x85);
const std::string kTuple2 = Op(0x86);
const std::string kFalse = Op(0x89);
const std::string kTrue = Op(0x88);

Result<PickleGraph> RunBytes(std::string_view pickle, const ParseLimits& limits = {}) {
  return RunPickle(AsBytes(pickle), limits);
}

// ('storage', torch.<type>, '<key>', 'cpu', numel) then BINPERSID.
std::string StoragePid(std::string_view type, std::string_view key, uint8_t numel) {
  return "((" + Str("storage") + "ctorch\n" + std::string(type) + "\n" + Str(key) + Str("cpu") + Int1(numel) + "tQ";
}

// _rebuild_tensor_v2(pid, offset, size, stride, False, OrderedDict()) as the
// tail of an already open MARK.
std::string Tensor(std::string_view type, std::string_view key, uint8_t numel, uint8_t offset,
                   const std::string& size, const std::string& stride) {
  return "ctorch._utils\n_rebuild_tensor_v2\n" + StoragePid(type, key, numel) + Int1(offset) + size + stride + kFalse +
         "ccollections\nOrderedDict\n)R" + "tR";
}

TEST(PickleMachineTest, BuildsValuesForCommonOpcodes) {
  // {'a': [1, -2, 3.5, None, True, b'xy'], 'b': (300, 70000)} with memo use.
  std::string p = kProto2 + "}" + Put(0) + "(" + Str("a");
  p += "]" + Put(1) + "(" + Int1(1) + "J" + Le32(0xfffffffe);
  p += "G" + Op(0x40) + Op(0x0c) + std::string(6, '\0') + "N" + kTrue + "C" + Op(2) + "xy" + "e";
  p += Str("b") + "M" + Op(0x2c) + Op(0x01) + Op(0x8a) + Op(3) + Op(0x70) + Op(0x11) + Op(0x01) + kTuple2 + "u.";
  auto graph = RunBytes(p);
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  const PickleNode* root = graph->root();
  ASSERT_EQ(root->kind, Kind::kDict);
  ASSERT_EQ(root->entries.size(), 2u);
  const PickleNode* list = root->entries[0].second;
  ASSERT_EQ(list->kind, Kind::kList);
  ASSERT_EQ(list->items.size(), 6u);
  EXPECT_EQ(list->items[0]->int_value, 1);
  EXPECT_EQ(list->items[1]->int_value, -2);
  EXPECT_EQ(list->items[2]->float_value, 3.5);
  EXPECT_EQ(list->items[3]->kind, Kind::kNone);
  EXPECT_TRUE(list->items[4]->bool_value);
  EXPECT_EQ(list->items[5]->text, "xy");
  const PickleNode* tuple = root->entries[1].second;
  ASSERT_EQ(tuple->kind, Kind::kTuple);
  EXPECT_EQ(tuple->items[0]->int_value, 300);
  EXPECT_EQ(tuple->items[1]->int_value, 70000);
}

TEST(PickleMachineTest, GlobalsAndReduceStaySymbolic) {
  auto graph = RunBytes("cos\nsystem\n" + Str("ls") + kTuple1 + "R.");
  ASSERT_TRUE(graph.ok());
  EXPECT_EQ(graph->root()->kind, Kind::kCall);
  EXPECT_EQ(graph->root()->CalleeName(), "os.system");
  EXPECT_EQ(graph->root()->args->items[0]->text, "ls");
}

TEST(PickleMachineTest, MalformedPicklesAreErrors) {
  EXPECT_EQ(RunBytes("").status().code(), StatusCode::kCorruption);
  EXPECT_EQ(RunBytes(kProto2 + "}").status().code(), StatusCode::kCorruption);  // no STOP
  EXPECT_EQ(RunBytes(".").status().code(), StatusCode::kCorruption);            // empty stack
  EXPECT_EQ(RunBytes(Get(5) + ".").status().code(), StatusCode::kCorruption);   // memo never set
  EXPECT_EQ(RunBytes("X" + Le32(0x7fffffff) + ".").status().code(), StatusCode::kCorruption);  // past end
  EXPECT_EQ(RunBytes("(" + Int1(1) + "s.").status().code(), StatusCode::kCorruption);  // underflow past mark
  EXPECT_EQ(RunBytes(Int1(1) + Int1(1) + Int1(2) + "s.").status().code(), StatusCode::kCorruption);  // not a dict
  EXPECT_EQ(RunBytes("I12\n.").status().code(), StatusCode::kUnsupported);  // text opcode
  EXPECT_EQ(RunBytes(Op(0xff) + ".").status().code(), StatusCode::kUnsupported);
}

TEST(PickleMachineTest, LimitsAreEnforced) {
  ParseLimits limits;
  limits.max_pickle_depth = 10;
  EXPECT_EQ(RunBytes(std::string(11, '(') + "N.", limits).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(RunBytes(std::string(10, '(') + "N.", limits).ok());
  limits = {};
  limits.max_pickle_ops = 100;
  EXPECT_EQ(RunBytes(std::string(200, 'N') + ".", limits).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(RunBytes(std::string(50, 'N') + ".", limits).ok());
  limits = {};
  limits.max_pickle_memo = 4;
  EXPECT_EQ(RunBytes("Nr" + Le32(16) + ".", limits).status().code(), StatusCode::kInvalidArgument);
  limits = {};
  limits.max_pickle_bytes = 3;
  EXPECT_EQ(RunBytes("N.N.", limits).status().code(), StatusCode::kInvalidArgument);
}

TEST(PickleMachineTest, DeepNestingIsBoundedInTheWalk) {
  // 5000 nested lists built with APPEND (no MARKs): the machine accepts it,
  // the storage walk must refuse it instead of recursing without bound.
  std::string p = "]";
  for (int i = 0; i < 5000; ++i) p += "]";
  for (int i = 0; i < 5000; ++i) p += "a";
  p += ".";
  auto graph = RunBytes(p);
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  EXPECT_EQ(FindTorchStorages(*graph, ParseLimits{}).status().code(), StatusCode::kInvalidArgument);
}

TEST(PickleMachineTest, SharedSubgraphsAreWalkedOnce) {
  // l0 = [None]; l_i = [l_{i-1}, l_{i-1}]: 2^40 paths through 41 lists.
  std::string p = "]" + Put(0) + "Na";
  for (int i = 1; i <= 40; ++i) p += "]" + Put(i) + "(" + Get(i - 1) + Get(i - 1) + "e";
  p += ".";
  auto graph = RunBytes(p);
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  auto storages = FindTorchStorages(*graph, ParseLimits{});
  ASSERT_TRUE(storages.ok());
  EXPECT_TRUE(storages->empty());
}

TEST(PickleMachineTest, LongKeysReusedManyTimesStayCheap) {
  // One 1 MiB key recalled from the memo for 100000 entries.
  std::string p = "}" + Str(std::string(1 << 20, 'k')) + Put(0) + "0(";
  for (int i = 0; i < 100000; ++i) p += Get(0) + "N";
  p += "u.";
  auto graph = RunBytes(p);
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  EXPECT_TRUE(FindTorchStorages(*graph, ParseLimits{}).ok());
  // With a container value the key path is built once, and refused.
  auto nested = RunBytes("}" + Str(std::string(1 << 20, 'k')) + "}s.");
  ASSERT_TRUE(nested.ok());
  auto storages = FindTorchStorages(*nested, ParseLimits{});
  EXPECT_EQ(storages.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(storages.status().message().find("longer"), std::string::npos) << storages.status().ToString();
}

TEST(TorchPickleTest, FindsStoragesWithNamesDtypesAndShapes) {
  // {'w': f32 tensor (2,3), 'v': view at offset 1 of the same storage,
  //  'opt': {3: [half tensor of 4 elements viewed as (2,)]}}
  std::string p = kProto2 + "}(" + Str("w");
  p += Tensor("FloatStorage", "0", 6, 0, Int1(2) + Int1(3) + kTuple2, Int1(3) + Int1(1) + kTuple2);
  p += Str("v") + Tensor("FloatStorage", "0", 6, 1, Int1(2) + kTuple1, Int1(1) + kTuple1);
  p += Str("opt") + "}" + Int1(3) + "](";
  p += Tensor("HalfStorage", "1", 4, 0, Int1(2) + kTuple1, Int1(1) + kTuple1);
  p += "esu.";
  auto graph = RunBytes(p);
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  auto storages = FindTorchStorages(*graph, ParseLimits{});
  ASSERT_TRUE(storages.ok()) << storages.status().ToString();
  ASSERT_EQ(storages->size(), 2u);
  EXPECT_EQ((*storages)[0].name, "w");
  EXPECT_EQ((*storages)[0].key, "0");
  EXPECT_EQ((*storages)[0].dtype, DType::kF32);
  EXPECT_EQ((*storages)[0].numel, 6u);
  EXPECT_EQ((*storages)[0].shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ((*storages)[1].name, "opt.3.0");
  EXPECT_EQ((*storages)[1].dtype, DType::kF16);
  EXPECT_EQ((*storages)[1].shape, (std::vector<uint64_t>{4}));  // a partial view: shape {numel}
}

TEST(TorchPickleTest, DtypeGlobalsAndUnknownTypes) {
  EXPECT_EQ(TorchDTypeFromGlobal("torch.BFloat16Storage"), DType::kBF16);
  EXPECT_EQ(TorchDTypeFromGlobal("torch.bfloat16"), DType::kBF16);
  EXPECT_EQ(TorchDTypeFromGlobal("torch.float32"), DType::kF32);
  EXPECT_EQ(TorchDTypeFromGlobal("torch.BoolStorage"), DType::kBool);
  EXPECT_EQ(TorchDTypeFromGlobal("torch.LongStorage"), DType::kI64);
  EXPECT_EQ(TorchDTypeFromGlobal("torch.QInt8Storage"), DType::kUnknown);
  EXPECT_EQ(TorchDTypeFromGlobal("os.system"), DType::kUnknown);
}

TEST(TorchPickleTest, MalformedPersistentIdIsCorruption) {
  auto graph = RunBytes("(" + Str("storage") + "tQ.");
  ASSERT_TRUE(graph.ok());
  EXPECT_EQ(FindTorchStorages(*graph, ParseLimits{}).status().code(), StatusCode::kCorruption);
}

}  // namespace
}  // namespace ckptfs
