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
    if (!delta_compress(tensor.prev, tensor.next, tensor.count, &delta, options_).ok())
      return false;
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
    return delta_decompress(tensor.prev, tensor.count, payload, size, checksum, out, tensor.count,
                            1)
        .ok();
  }

 private:
  std::string name_;
  Options options_;
};

// One row per effort level (0..3) of `format`: the library's default effort is `name`
// itself, the others `name`_eN (so arc_v3 is exactly what delta_compress does by default).
void AddArcV3(std::vector<std::unique_ptr<Codec>>* codecs, const std::string& name, Format format) {
  const int default_effort = Options().effort;
  for (int effort = 0; effort <= 3; ++effort) {
    const std::string row = effort == default_effort ? name : name + "_e" + std::to_string(effort);
    codecs->push_back(std::make_unique<ArcV3Codec>(row, format, effort));
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
  // One row per arc_v3 format and effort level: ARCv3 as published (arc_v3_published,
  // arc_v3_published_e0 ..), then the library's default format, the README's arc_v3
  // (arc_v3, arc_v3_e0 ..). Release 1.0.0 named them arc_v3_eN and arc_default_eN.
  AddArcV3(&codecs, kPublishedCodec, Format::kPublished);
  AddArcV3(&codecs, kDefaultCodec, Format::kDefault);
  return codecs;
}

}  // namespace bench
}  // namespace arc_v3
