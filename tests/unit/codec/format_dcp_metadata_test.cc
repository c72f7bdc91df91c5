// A DCP save's .metadata (codec/format/dcp_metadata.h): its storage items
// read from both pickled forms, and a shard's tensors named by them only
// when they describe the shard exactly.
#include <gtest/gtest.h>

#include <string>

#include "codec/format/dcp_metadata.h"
#include "codec/policy/policy.h"

namespace ckptfs {
namespace {

std::vector<std::byte> FromHex(std::string_view hex) {
  std::vector<std::byte> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>(std::stoi(std::string(hex.substr(2 * i, 2)), nullptr, 16));
  return out;
}

// pickle.dumps(protocol=2) of {"state_dict_metadata": {}, "storage_data":
// {("model.w", (0, 0)): ("__0_0.distcp", 0, 100), ("optim.state.w.exp_avg",
// (0,)): ("__0_0.distcp", 100, 50), ("lr", None): ("__1_0.distcp", 0, 20)},
// "planner_data": None}: the structure as plain dicts and tuples.
constexpr std::string_view kDictForm =
    "80027d710028581300000073746174655f646963745f6d6574616461746171017d7102580c00000073746f726167655f6461746171037d7104"
    "2858070000006d6f64656c2e7771054b004b00867106867107580c0000005f5f305f302e64697374637071084b004b6487710958150000006f"
    "7074696d2e73746174652e772e6578705f617667710a4b0085710b86710c68084b644b3287710d58020000006c72710e4e86710f580c000000"
    "5f5f315f302e64697374637071104b004b1487711175580c000000706c616e6e65725f6461746171124e752e";

// The same first two items as PyTorch pickles them: Metadata(
// state_dict_metadata={}, planner_data=None, storage_data={MetadataIndex(
// fqn, offset, index): _StorageInfo(relative_path, offset, length)}), each
// a dataclass (NEWOBJ, then BUILD with its fields), made with classes of
// those module paths.
constexpr std::string_view kDataclassForm =
    "800263746f7263682e64697374726962757465642e636865636b706f696e742e6d657461646174610a4d657461646174610a7100298171017d"
    "710228581300000073746174655f646963745f6d6574616461746171037d7104580c000000706c616e6e65725f6461746171054e580c000000"
    "73746f726167655f6461746171067d71072863746f7263682e64697374726962757465642e636865636b706f696e742e6d657461646174610a"
    "4d65746164617461496e6465780a7108298171097d710a28580300000066716e710b58070000006d6f64656c2e77710c58060000006f666673"
    "6574710d4b004b0086710e5805000000696e646578710f4b00756263746f7263682e64697374726962757465642e636865636b706f696e742e"
    "66696c6573797374656d0a5f53746f72616765496e666f0a7110298171117d711228580d00000072656c61746976655f706174687113580c00"
    "00005f5f305f302e6469737463707114680d4b0058060000006c656e67746871154b6475626808298171167d711728680b58150000006f7074"
    "696d2e73746174652e772e6578705f6176677118680d4b00857119680f4b00756268102981711a7d711b2868136814680d4b6468154b327562"
    "7575622e";

TEST(DcpMetadataTest, BothPickledFormsGiveTheStorageItems) {
  for (std::string_view hex : {kDictForm, kDataclassForm}) {
    Result<std::vector<DcpStorageItem>> items = ParseDcpMetadata(FromHex(hex), ParseLimits{});
    ASSERT_TRUE(items.ok()) << items.status().ToString();
    ASSERT_GE(items->size(), 2u);
    EXPECT_EQ((*items)[0].fqn, "model.w");
    EXPECT_EQ((*items)[0].relative_path, "__0_0.distcp");
    EXPECT_EQ((*items)[0].offset, 0u);
    EXPECT_EQ((*items)[0].length, 100u);
    EXPECT_EQ((*items)[1].fqn, "optim.state.w.exp_avg");
    EXPECT_EQ((*items)[1].offset, 100u);
    EXPECT_EQ((*items)[1].length, 50u);
  }
}

TEST(DcpMetadataTest, OtherPicklesAreRefusedCleanly) {
  // {"a": 1}: no storage_data.
  EXPECT_EQ(ParseDcpMetadata(FromHex("80027d710058010000006171014b01732e"), ParseLimits{}).status().code(),
            StatusCode::kNotFound);
  // {"storage_data": {("w",): ("p", -1, 2)}}: a negative offset.
  EXPECT_EQ(ParseDcpMetadata(FromHex("80027d7100580c00000073746f726167655f6461746171017d7102580100000077710385710458010000"
                                     "007071054affffffff4b0287710673732e"),
                             ParseLimits{})
                .status()
                .code(),
            StatusCode::kCorruption);
  EXPECT_FALSE(ParseDcpMetadata(FromHex("8002"), ParseLimits{}).ok());
}

// A shard of three archives: pickled objects (no tensor), then two bare tensors.
Layout Shard() {
  Layout l;
  l.format = FileFormat::kDcp;
  l.archives = {{0, 700}, {700, 1500}, {2200, 1500}};
  l.tensors = {TensorInfo{"1/tensor", DType::kF32, {100}}, TensorInfo{"2/tensor", DType::kF32, {100}}};
  l.segments = {{0, 1000, -1}, {1000, 400, 0}, {1400, 1200, -1}, {2600, 400, 1}, {3000, 700, -1}};
  return l;
}

std::vector<DcpStorageItem> Items() {
  return {{"lr_scheduler", "__0_0.distcp", 0, 690},  // pickled objects may change length
          {"model.w", "__0_0.distcp", 700, 1500},
          {"optimizer.state.model.w.exp_avg_sq", "__0_0.distcp", 2200, 1500},
          {"model.w", "__1_0.distcp", 0, 1500}};
}

TEST(DcpMetadataTest, ShardTensorsAreNamedOnlyWhenTheItemsDescribeTheShard) {
  Layout l = Shard();
  ASSERT_TRUE(NameDcpShard(&l, "__0_0.distcp", Items()));
  EXPECT_EQ(l.tensors[0].name, "model.w");
  EXPECT_EQ(l.tensors[1].name, "optimizer.state.model.w.exp_avg_sq");

  auto refused = [](Layout shard, std::string_view file, const std::vector<DcpStorageItem>& given) {
    const Layout before = shard;
    EXPECT_FALSE(NameDcpShard(&shard, file, given));
    for (size_t t = 0; t < shard.tensors.size(); ++t) EXPECT_EQ(shard.tensors[t].name, before.tensors[t].name);
  };
  refused(Shard(), "__2_0.distcp", Items());  // another rank's file
  std::vector<DcpStorageItem> items = Items();
  items[2].length = 1499;  // a tensor archive of another length: another plan
  refused(Shard(), "__0_0.distcp", items);
  items = Items();
  items.pop_back();
  items.erase(items.begin());  // one item fewer than archives
  refused(Shard(), "__0_0.distcp", items);
  items = Items();
  items[2].fqn = "model.w";  // a name twice
  refused(Shard(), "__0_0.distcp", items);
  Layout nested = Shard();
  nested.tensors[1].name = "2/state.exp_avg";  // an archive of a dict, not a bare tensor
  refused(nested, "__0_0.distcp", Items());
  Layout plain = Shard();
  plain.format = FileFormat::kTorchZip;
  refused(plain, "__0_0.distcp", Items());
}

TEST(DcpMetadataTest, PolicyKeepsPositionalShardTensorsLosslessAndCodesNamedOnes) {
  const policy::Policy p = policy::Policy::Defaults();
  const TensorInfo positional{"3/tensor", DType::kF32, {100}};
  EXPECT_FALSE(p.BudgetFor("run/step-1/__0_0.distcp", FileFormat::kDcp, positional).lossy());
  EXPECT_TRUE(IsPositionalDcpName("3/tensor"));
  EXPECT_FALSE(IsPositionalDcpName("model.w"));
  EXPECT_FALSE(IsPositionalDcpName("/tensor"));
  const TensorInfo v{"optimizer.state.model.w.exp_avg_sq", DType::kF32, {100}};
  const lossy::Budget budget = p.BudgetFor("run/step-1/__0_0.distcp", FileFormat::kDcp, v);
  EXPECT_GT(budget.max_rel, 0) << "a second moment: a per-element bound";
  EXPECT_EQ(budget.rel_l2, 0);
  const TensorInfo w{"model.w", DType::kF32, {100}};
  EXPECT_GT(p.BudgetFor("run/step-1/__0_0.distcp", FileFormat::kDcp, w).rel_l2, 0);
}

}  // namespace
}  // namespace ckptfs
