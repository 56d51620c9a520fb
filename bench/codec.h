// The benchmark's codec interface and registry (in the style of FastPFor's IntegerCODEC
// and CODECFactory::allSchemes()): every competitor compresses one tensor's step
// (prev -> next) into bytes and rebuilds next from prev and those bytes.
//
// To benchmark a new arc_v3 format, add one line to AllCodecs() in bench/codecs.cc.
#ifndef ARC_V3_BENCH_CODEC_H_
#define ARC_V3_BENCH_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace arc_v3 {
namespace bench {

// One tensor: `count` BF16 values as a rows x cols matrix (1-D: count x 1).
struct TensorView {
  const uint16_t* prev = nullptr;
  const uint16_t* next = nullptr;  // null when decompressing
  size_t count = 0;
  uint64_t rows = 0, cols = 0;
};

class Codec {
 public:
  virtual ~Codec() = default;
  // Short stable name used in tables, --codecs and output files, e.g. "trl_draft".
  virtual std::string Name() const = 0;
  // Everything the receiver needs besides prev and the tensor's shape. Returns false on
  // failure (reported by the benchmark).
  virtual bool Compress(const TensorView& tensor, std::vector<uint8_t>* payload) const = 0;
  // Writes next (tensor.count values) to `out`, from tensor.prev and the payload.
  virtual bool Decompress(const TensorView& tensor, const uint8_t* payload, size_t size,
                          uint16_t* out) const = 0;
};

// arc_v3's rows: the library's default format at its default effort (the README's
// "arc_v3"), and ARCv3 as published (Format::kPublished) at that effort; the other effort
// levels are these names with _e0, _e1, _e3.
inline constexpr char kDefaultCodec[] = "arc_v3";
inline constexpr char kPublishedCodec[] = "arc_v3_published";
// The competitors to name as "smallest other": every row but arc_v3's own.
inline bool IsArcV3Codec(const std::string& name) {
  return name.rfind(kDefaultCodec, 0) == 0 || name.rfind(kPublishedCodec, 0) == 0;
}

// Every codec of the benchmark, in table order.
std::vector<std::unique_ptr<Codec>> AllCodecs();

}  // namespace bench
}  // namespace arc_v3

#endif  // ARC_V3_BENCH_CODEC_H_
