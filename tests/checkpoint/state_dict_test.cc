// arc_v3_checkpoint.hpp: state-dict deltas through the public API alone.
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "arc_v3_checkpoint.hpp"

namespace {

using arc_v3::ErrorCode;
using arc_v3::NamedTensor;
using arc_v3::Status;

// Tensors with their memory.
struct StateDict {
  std::map<std::string, std::vector<uint8_t>> bytes;
  std::vector<NamedTensor> tensors;

  void Add(const std::string& name, const std::string& dtype, std::vector<uint64_t> shape,
           std::vector<uint8_t> data) {
    bytes[name] = std::move(data);
    tensors.push_back(NamedTensor{name, dtype, std::move(shape), nullptr});
  }
  // Points the tensors at their bytes (after every Add: the map's nodes stay put).
  const std::vector<NamedTensor>& View() {
    for (NamedTensor& t : tensors) t.data = bytes[t.name].data();
    return tensors;
  }
};

std::vector<uint8_t> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// A small optimizer step: a few BF16 values move by their last mantissa bit.
std::vector<uint8_t> Step(std::vector<uint8_t> bf16, uint32_t seed) {
  std::mt19937 rng(seed);
  for (size_t i = 0; i < bf16.size() / 2; ++i) {
    if (rng() % 50 == 0) bf16[2 * i] ^= 1;
  }
  return bf16;
}

struct Pair {
  StateDict prev, next;
};

Pair MakePair() {
  Pair p;
  const std::vector<uint8_t> w = Random(2 * 64 * 512, 1), b = Random(2 * 512, 2);
  const std::vector<uint8_t> f = Random(4 * 100, 3), r = Random(2 * 16 * 16, 4);
  p.prev.Add("layer.weight", "BF16", {64, 512}, w);
  p.prev.Add("layer.bias", "BF16", {512}, b);
  p.prev.Add("norm.scale", "F32", {100}, f);
  p.prev.Add("reshaped", "BF16", {16, 16}, r);
  p.prev.Add("removed", "I64", {3}, Random(24, 5));
  p.next.Add("layer.weight", "BF16", {64, 512}, Step(w, 6));
  p.next.Add("layer.bias", "BF16", {512}, b);  // unchanged
  std::vector<uint8_t> f2 = f;
  f2[7] ^= 0x40;
  p.next.Add("norm.scale", "F32", {100}, f2);
  p.next.Add("reshaped", "BF16", {256}, r);
  p.next.Add("added", "F16", {2, 3}, Random(12, 7));
  p.next.Add("empty", "BF16", {0, 4}, {});
  return p;
}

// Applies `delta` to `prev` into vectors of its own.
Status Apply(const std::vector<NamedTensor>& prev, const std::vector<uint8_t>& delta,
             std::map<std::string, std::vector<uint8_t>>* memory, std::vector<NamedTensor>* next) {
  const arc_v3::TensorAllocator allocate = [&](const std::string& name, const std::string& dtype,
                                               const std::vector<uint64_t>& shape, uint64_t bytes,
                                               void** data) {
    uint64_t expected = arc_v3::DtypeSize(dtype);
    for (uint64_t d : shape) expected *= d;
    REQUIRE(bytes == expected);
    auto& v = (*memory)[name];
    v.assign(bytes, 0xEE);
    *data = v.data();
    return Status::Ok();
  };
  return arc_v3::StateDictApply(prev, delta.data(), delta.size(), allocate, 2, next);
}

}  // namespace

TEST_CASE("a state dict's delta rebuilds the next state dict bit for bit, any thread count") {
  Pair p = MakePair();
  std::vector<uint8_t> delta, delta1;
  arc_v3::StateDictOptions options;
  REQUIRE(arc_v3::StateDictDiff(p.prev.View(), p.next.View(), options, &delta).ok());
  options.threads = 1;
  REQUIRE(arc_v3::StateDictDiff(p.prev.View(), p.next.View(), options, &delta1).ok());
  CHECK(delta == delta1);
  REQUIRE(delta.size() >= 4);
  CHECK(std::memcmp(delta.data(), arc_v3::kDeltaMagic, 4) == 0);
  // Much smaller than the tensors it rebuilds.
  CHECK(delta.size() < 2 * 64 * 512 / 4);

  std::map<std::string, std::vector<uint8_t>> memory;
  std::vector<NamedTensor> rebuilt;
  REQUIRE(Apply(p.prev.View(), delta, &memory, &rebuilt).ok());
  REQUIRE(rebuilt.size() == p.next.tensors.size());
  for (size_t i = 0; i < rebuilt.size(); ++i) {
    const NamedTensor& want = p.next.View()[i];
    CHECK(rebuilt[i].name == want.name);
    CHECK(rebuilt[i].dtype == want.dtype);
    CHECK(rebuilt[i].shape == want.shape);
    if (want.name == "empty") {
      CHECK(rebuilt[i].data == nullptr);
      CHECK(memory.count("empty") == 0);
      continue;
    }
    CHECK(rebuilt[i].data == memory[want.name].data());
    CHECK(memory[want.name] == p.next.bytes[want.name]);
  }
}

TEST_CASE("InspectDelta lists what a delta holds without decoding it") {
  Pair p = MakePair();
  std::vector<uint8_t> delta;
  REQUIRE(arc_v3::StateDictDiff(p.prev.View(), p.next.View(), {}, &delta).ok());
  arc_v3::DeltaInfo info;
  REQUIRE(arc_v3::InspectDelta(delta.data(), delta.size(), &info).ok());
  CHECK_FALSE(info.directory);
  CHECK(info.container_version >= 1);
  CHECK(info.removed_tensors == std::vector<std::string>{"removed"});
  std::map<std::string, arc_v3::DeltaTensorInfo> by_name;
  for (const auto& t : info.tensors) by_name[t.name] = t;
  REQUIRE(by_name.size() == 6);
  CHECK(by_name["layer.weight"].kind == "delta");
  CHECK(by_name["layer.weight"].shape == std::vector<uint64_t>{64, 512});
  CHECK_FALSE(by_name["layer.weight"].coders.empty());
  CHECK(by_name["added"].kind == "added");
  CHECK(by_name["reshaped"].kind == "reshaped");
  CHECK(by_name["norm.scale"].dtype == "F32");
}

TEST_CASE("a wrong base, a damaged delta and a failing allocator are errors, not results") {
  Pair p = MakePair();
  std::vector<uint8_t> delta;
  REQUIRE(arc_v3::StateDictDiff(p.prev.View(), p.next.View(), {}, &delta).ok());
  std::map<std::string, std::vector<uint8_t>> memory;
  std::vector<NamedTensor> rebuilt;

  SUBCASE("another base") {
    p.prev.bytes["layer.weight"][100] ^= 0x01;
    const Status s = Apply(p.prev.View(), delta, &memory, &rebuilt);
    CHECK(s.code() == ErrorCode::kChecksumMismatch);
    CHECK(rebuilt.empty());
  }
  SUBCASE("truncated, at every tenth length") {
    for (size_t n = 0; n < delta.size(); n += 1 + delta.size() / 10) {
      std::vector<uint8_t> cut(delta.begin(), delta.begin() + n);
      CHECK_FALSE(Apply(p.prev.View(), cut, &memory, &rebuilt).ok());
      CHECK(rebuilt.empty());
      arc_v3::DeltaInfo info;
      CHECK_FALSE(arc_v3::InspectDelta(cut.data(), cut.size(), &info).ok());
    }
  }
  SUBCASE("a flipped byte in the stored data") {
    std::vector<uint8_t> bad = delta;
    bad[bad.size() - 1] ^= 0x55;
    CHECK_FALSE(Apply(p.prev.View(), bad, &memory, &rebuilt).ok());
    CHECK(rebuilt.empty());
  }
  SUBCASE("the allocator refuses") {
    const arc_v3::TensorAllocator refuse = [](const std::string&, const std::string&,
                                              const std::vector<uint64_t>&, uint64_t, void**) {
      return Status(ErrorCode::kOutOfMemory, "no room");
    };
    const Status s =
        arc_v3::StateDictApply(p.prev.View(), delta.data(), delta.size(), refuse, 1, &rebuilt);
    CHECK(s.code() == ErrorCode::kOutOfMemory);
    CHECK(rebuilt.empty());
  }
  SUBCASE("a name twice") {
    std::vector<NamedTensor> twice = p.next.View();
    twice.push_back(twice.front());
    std::vector<uint8_t> out;
    CHECK(arc_v3::StateDictDiff(p.prev.View(), twice, {}, &out).code() ==
          ErrorCode::kInvalidArgument);
  }
}

TEST_CASE("DtypeSize knows the safetensors dtypes") {
  CHECK(arc_v3::DtypeSize("BF16") == 2);
  CHECK(arc_v3::DtypeSize("F32") == 4);
  CHECK(arc_v3::DtypeSize("I64") == 8);
  CHECK(arc_v3::DtypeSize("BOOL") == 1);
  CHECK(arc_v3::DtypeSize("nope") == 0);
}
