// Fuzz target: the checkpoint delta container parser (src/checkpoint/container.h). The header
// and manifest checksums would stop a byte-level fuzzer at the door, so the harness
// builds a well-formed envelope around fuzzer-chosen content: input = u16 whose low 15
// bits are the data-section length D and whose top bit selects container version 2 (else
// 1), then the manifest JSON, then D bytes of data section. The manifest is
// zstd-compressed and both checksums are filled in, so every run reaches the JSON
// validation (Reader::Open) and then the piece and group decoders (ReadPiece, DecodePiece,
// ReadGroup, DecodeGroup).
// Promises checked: no crash or out-of-bounds access, every accepted piece and group lies
// inside the data section, groups hold only non-empty BF16 delta tensors of their file,
// decoded pieces and groups match their target checksum, and InspectDelta of the same
// container lists every tensor and group once.
#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "arc_v3_checkpoint.hpp"
#include "src/checkpoint/container.h"
#include "src/checkpoint/inspect.h"
#include "src/checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_common.h"

namespace arc_v3 {
namespace fuzz {

class MemorySource : public checkpoint::ByteSource {
 public:
  explicit MemorySource(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_.size(); }
  Status Read(uint64_t offset, uint64_t size, std::vector<uint8_t>* scratch,
              const uint8_t** data) const override {
    if (offset > bytes_.size() || size > bytes_.size() - offset) {
      return Status(ErrorCode::kTruncated, "read past the end");
    }
    // Copy into an exactly-sized buffer so that ASan sees reads past the range.
    scratch->assign(bytes_.begin() + offset, bytes_.begin() + offset + size);
    scratch->shrink_to_fit();
    *data = scratch->data();
    return Status::Ok();
  }

 private:
  std::vector<uint8_t> bytes_;
};

void PutLe(uint64_t value, int bytes, uint8_t* out) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

// Pieces decoded per run, and their size cap, keep each run fast.
constexpr uint64_t kMaxPieceBytes = uint64_t{1} << 20;

int FuzzContainer(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t data_size = std::min<size_t>(data[0] | ((data[1] & 0x7F) << 8), size - 2);
  const uint16_t version = (data[1] & 0x80) ? 2 : 1;
  const std::string json(reinterpret_cast<const char*>(data) + 2, size - 2 - data_size);
  const uint8_t* section = data + size - data_size;

  std::vector<uint8_t> manifest(ZSTD_compressBound(json.size()));
  const size_t zsize = ZSTD_compress(manifest.data(), manifest.size(), json.data(), json.size(), 1);
  FUZZ_CHECK(!ZSTD_isError(zsize), "zstd compress");
  manifest.resize(zsize);
  std::vector<uint8_t> bytes(checkpoint::kHeaderSize);
  std::memcpy(bytes.data(), checkpoint::kMagic, 4);
  PutLe(version, 2, bytes.data() + 4);
  PutLe(manifest.size(), 8, bytes.data() + 8);
  PutLe(checkpoint::Hash(manifest.data(), manifest.size()), 8, bytes.data() + 16);
  PutLe(data_size, 8, bytes.data() + 24);
  PutLe(checkpoint::Hash(bytes.data(), 32), 8, bytes.data() + 32);
  bytes.insert(bytes.end(), manifest.begin(), manifest.end());
  bytes.insert(bytes.end(), section, section + data_size);

  checkpoint::Reader reader;
  const Status opened = checkpoint::Reader::Open(
      std::unique_ptr<checkpoint::ByteSource>(new MemorySource(bytes)), &reader);
  if (!opened.ok()) return 0;

  std::vector<uint8_t> scratch;
  auto check_piece = [&](const checkpoint::Piece& piece, uint64_t raw_bytes, size_t element_size,
                         bool bf16) {
    FUZZ_CHECK(piece.offset <= data_size && piece.size <= data_size - piece.offset,
               "accepted a piece outside the data section");
    const uint8_t* stored = nullptr;
    if (!reader.ReadPiece(piece, &scratch, &stored).ok()) return;
    if (raw_bytes > kMaxPieceBytes || element_size == 0) return;
    // Base of zeros; arc_v3 pieces need an aligned BF16 base.
    std::vector<uint16_t> base((raw_bytes + 1) / 2, 0);
    std::vector<uint16_t> out((raw_bytes + 1) / 2, 0);
    const uint8_t* base_bytes = reinterpret_cast<const uint8_t*>(base.data());
    const Status s = checkpoint::DecodePiece(piece, stored, bf16 ? base_bytes : nullptr, raw_bytes,
                                             element_size, reinterpret_cast<uint8_t*>(out.data()));
    if (s.ok()) {
      FUZZ_CHECK(checkpoint::Hash(out.data(), raw_bytes) == piece.target_xxh3,
                 "decoded piece does not match its checksum");
    }
  };
  for (const checkpoint::FileEntry& file : reader.manifest().files) {
    check_piece(file.header, file.header.row_end - file.header.row_begin, 1, false);
    if (!file.fills.empty()) {
      uint64_t total = 0;
      for (const auto& fill : file.fills) total += fill.second;
      check_piece(file.fill, total, 1, false);
    }
    for (const checkpoint::Group& group : file.groups) {
      FUZZ_CHECK(group.offset <= data_size && group.size <= data_size - group.offset,
                 "accepted a group outside the data section");
      FUZZ_CHECK(!group.members.empty(), "accepted a group without members");
      std::vector<const uint8_t*> bases;
      std::vector<uint64_t> member_bytes;
      for (size_t member : group.members) {
        FUZZ_CHECK(member < file.tensors.size(), "group member out of range");
        const checkpoint::TensorEntry& tensor = file.tensors[member];
        FUZZ_CHECK(tensor.kind == checkpoint::TensorKind::kDelta && tensor.dtype == "BF16" &&
                       tensor.bytes() > 0 && tensor.pieces.empty(),
                   "accepted a group member that is not a non-empty BF16 delta");
        member_bytes.push_back(tensor.bytes());
      }
      const uint8_t* stored = nullptr;
      if (!reader.ReadGroup(group, &scratch, &stored).ok()) continue;
      if (group.elements > kMaxPieceBytes / 2) continue;
      // Members' bases are zeros, one buffer each so that ASan sees reads past them.
      std::vector<std::vector<uint16_t>> zeros;
      for (uint64_t b : member_bytes) {
        zeros.emplace_back(b / 2, 0);
        bases.push_back(reinterpret_cast<const uint8_t*>(zeros.back().data()));
      }
      std::vector<uint16_t> out;
      if (checkpoint::DecodeGroup(group, stored, bases, member_bytes, &out).ok()) {
        FUZZ_CHECK(out.size() == group.elements &&
                       checkpoint::Hash(out.data(), out.size() * 2) == group.target_xxh3,
                   "decoded group does not match its checksum");
      }
    }
    for (const checkpoint::TensorEntry& tensor : file.tensors) {
      const size_t element_size = safetensors::DTypeSize(tensor.dtype);
      for (const checkpoint::Piece& piece : tensor.pieces) {
        FUZZ_CHECK(piece.row_begin <= piece.row_end && piece.row_end <= tensor.rows(),
                   "accepted a piece outside its tensor");
        const uint64_t rows = piece.row_end - piece.row_begin;
        const uint64_t row_bytes = tensor.row_bytes();
        if (row_bytes != 0 && rows > kMaxPieceBytes / row_bytes) continue;
        check_piece(piece, rows * row_bytes, element_size, tensor.dtype == "BF16");
      }
    }
  }
  // What inspect reports of the same container, its payloads' statistics read from
  // untrusted bytes (`arc_v3 inspect` of any file).
  DeltaInfo info;
  if (checkpoint::Inspect(reader, true, nullptr, 1, &info).ok()) {
    size_t tensors = 0, groups = 0;
    for (const checkpoint::FileEntry& file : reader.manifest().files) {
      tensors += file.tensors.size();
      groups += file.groups.size();
    }
    FUZZ_CHECK(info.tensors.size() == tensors && info.groups.size() == groups &&
                   info.delta_bytes == bytes.size(),
               "Inspect lists other tensors or groups than the manifest");
    for (const DeltaTensorInfo& t : info.tensors) {
      FUZZ_CHECK(t.group < static_cast<int64_t>(groups), "Inspect names a group that is not there");
      FUZZ_CHECK(t.delta_bytes <= data_size,
                 "Inspect counts more bytes than the data section holds");
    }
  }
  return 0;
}

}  // namespace fuzz
}  // namespace arc_v3

ARC_V3_FUZZ_ENTRY(arc_v3::fuzz::FuzzContainer)
