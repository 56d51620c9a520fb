// The registry: every codec the benchmark runs, in table order.
#include <cstring>
#include <string>

#include "arc_v3.hpp"
#include "bench/baselines/common.h"
#include "bench/codec.h"

namespace arc_v3 {
namespace bench {
namespace {

// arc_v3 with fixed options, single-threaded per tensor (the benchmark parallelises over
// tensors). The payload counts the 8-byte checksum the receiver needs with the bytes.
class ArcV3Codec : public Codec {
 public:
  ArcV3Codec(std::string name, Format format, int effort) : name_(std::move(name)) {
    options_.format = format;
    options_.effort = effort;
    options_.threads = 1;
  }
  std::string Name() const override { return name_; }
  bool Compress(const TensorView& tensor, std::vector<uint8_t>* payload) const override {
    Delta delta;
    if (!delta_compress(tensor.prev, tensor.next, tensor.count, &delta, options_).ok()) return false;
    *payload = std::move(delta.bytes);
    const size_t at = payload->size();
    payload->resize(at + sizeof(delta.checksum));
    std::memcpy(payload->data() + at, &delta.checksum, sizeof(delta.checksum));
    return true;
  }
  bool Decompress(const TensorView& tensor, const uint8_t* payload, size_t size,
                  uint16_t* out) const override {
    uint64_t checksum;
    if (size < sizeof(checksum)) return false;
    size -= sizeof(checksum);
    std::memcpy(&checksum, payload + size, sizeof(checksum));
    return delta_decompress(tensor.prev, tensor.count, payload, size, checksum, out, tensor.count, 1).ok();
  }

 private:
  std::string name_;
  Options options_;
};

void AddArcV3(std::vector<std::unique_ptr<Codec>>* codecs, const std::string& name, Format format) {
  for (int effort = 0; effort <= 3; ++effort) {
    codecs->push_back(std::make_unique<ArcV3Codec>(name + "_e" + std::to_string(effort), format, effort));
  }
}

}  // namespace

std::vector<std::unique_ptr<Codec>> AllCodecs() {
  std::vector<std::unique_ptr<Codec>> codecs;
  codecs.push_back(MakeTrlDraft());
  codecs.push_back(MakeTrlGapDelta());
  codecs.push_back(MakePulseSync());
  codecs.push_back(MakeArcV2Like());
  codecs.push_back(MakeSlimeDeltasZstd());
  codecs.push_back(MakeZstdXor(19));
  codecs.push_back(MakeLz4Xor());
  // One line per arc_v3 format (all four effort levels each).
  AddArcV3(&codecs, "arc_v3", Format::kArcV3);
  AddArcV3(&codecs, "arc_default", Format::kDefault);
  return codecs;
}

}  // namespace bench
}  // namespace arc_v3
