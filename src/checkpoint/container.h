// The checkpoint delta container (src/checkpoint/FORMAT.md): a checksummed JSON manifest that
// lists, per tensor, the independently decodable pieces (row blocks) of a delta between
// two safetensors checkpoints, followed by the pieces' bytes. This layer parses and
// validates containers and codes single pieces; checkpoint_delta.h builds the diff /
// apply / verify operations on top of it. Not part of the codec library (//:arc_v3).
#ifndef ARC_V3_SRC_CHECKPOINT_CONTAINER_H_
#define ARC_V3_SRC_CHECKPOINT_CONTAINER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "arc_v3.hpp"

namespace arc_v3 {
namespace checkpoint {

constexpr uint8_t kMagic[4] = {'A', '3', 'D', 'C'};
// Version 2 adds groups (several small BF16 tensors in one arc_v3 payload). A writer
// uses version 2 only for containers that have groups, so version-1 readers still read
// the rest.
constexpr uint16_t kVersion = 2;
constexpr uint16_t kVersionWithoutGroups = 1;
constexpr size_t kHeaderSize = 40;
// Target size of one piece: rows are grouped so that a piece holds about this many
// elements (one arc_v3 payload of two 1M-element chunks for BF16).
constexpr uint64_t kPieceElements = uint64_t{1} << 21;
// BF16 delta tensors that arc_v3::delta_worth_grouping picks (under kGroupBelowElements
// elements, under kGroupMaxChanges changed) are coded in groups of at most
// kPieceElements elements: each payload of its own would pay a frame, a checksum and
// the time its adaptive contexts take to learn, plus about 46 manifest bytes per piece. A group
// holds at least two members.
static_assert(kGroupBelowElements <= kPieceElements / 2, "groups of one");

// Random read access to container bytes. A receiver can implement it over HTTP range
// requests: Reader only asks for the header, the manifest and the pieces it decodes.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Points *data at bytes [offset, offset + size), using *scratch if it must copy; the
  // pointer stays valid until *scratch changes or the source is destroyed.
  // Safe to call from several threads with distinct scratch buffers.
  virtual Status Read(uint64_t offset, uint64_t size, std::vector<uint8_t>* scratch,
                      const uint8_t** data) const = 0;
};

// A read-only memory-mapped file (also used for the checkpoints).
class MappedFile : public ByteSource {
 public:
  ~MappedFile() override;
  static Status Open(const std::string& path, std::unique_ptr<MappedFile>* file);
  uint64_t size() const override { return size_; }
  const uint8_t* data() const { return data_; }
  Status Read(uint64_t offset, uint64_t size, std::vector<uint8_t>* scratch,
              const uint8_t** data) const override;

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
};

// Container bytes in memory.
class MemorySource : public ByteSource {
 public:
  explicit MemorySource(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
  uint64_t size() const override { return bytes_.size(); }
  Status Read(uint64_t offset, uint64_t size, std::vector<uint8_t>* scratch,
              const uint8_t** data) const override;
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// How a piece's stored bytes turn into the raw bytes that are XORed onto the base.
enum class Coder : uint8_t {
  kStored = 0,      // the XOR itself
  kZstd = 1,        // one zstd frame of the XOR
  kZstdPlanes = 2,  // one zstd frame of the XOR split into byte planes
  kArcV3 = 3,       // an arc_v3 payload (BF16 only; decoded by delta_decompress)
};
const char* CoderName(Coder coder);

struct Piece {
  uint64_t row_begin = 0, row_end = 0;  // rows [begin, end) of the tensor
  uint64_t offset = 0, size = 0;        // stored bytes, relative to the data section
  Coder coder = Coder::kStored;
  uint64_t xxh3 = 0;         // of the stored bytes
  uint64_t base_xxh3 = 0;    // of the base rows (0 and unchecked for whole tensors)
  uint64_t target_xxh3 = 0;  // of the target rows
  uint64_t changed = 0;      // elements whose bits differ (informative)
};

// Why a tensor is in the container.
enum class TensorKind : uint8_t {
  kDelta = 0,     // same name, dtype and shape in the base: XOR / arc_v3 delta
  kAdded = 1,     // absent from the base: carried whole
  kReshaped = 2,  // dtype or shape differs from the base: carried whole
};
const char* TensorKindName(TensorKind kind);

struct TensorEntry {
  static constexpr uint64_t kNoGroup = UINT64_MAX;
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  TensorKind kind = TensorKind::kDelta;
  uint64_t data_offset = 0;  // within the target file's data section
  // Over the pieces' checksums (src/checkpoint/FORMAT.md, "Tensor"). A grouped tensor has no
  // pieces: its base_xxh3 is that of its base bytes, and its group's target_xxh3 covers its target.
  uint64_t base_xxh3 = 0, target_xxh3 = 0;
  std::vector<Piece> pieces;
  uint64_t group = kNoGroup;  // index into its file's groups, or kNoGroup

  bool grouped() const { return group != kNoGroup; }
  uint64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  uint64_t row_bytes() const;  // bytes of one row
  uint64_t bytes() const { return rows() * row_bytes(); }
};

// Several whole BF16 delta tensors of one file coded as one arc_v3 payload
// (delta_compress_tensors), in the order the file lists them.
struct Group {
  uint64_t offset = 0, size = 0;  // stored bytes, relative to the data section
  uint64_t xxh3 = 0;              // of the stored bytes
  uint64_t target_xxh3 = 0;       // of the members' target bytes, concatenated
  std::vector<size_t> members;    // indices into the file's tensors, in payload order
  uint64_t elements = 0;          // of all members
};

// One output file: the bytes before the tensor data (the safetensors header, or the whole
// file for non-safetensors files such as model.safetensors.index.json), the bytes of the
// data section no tensor covers, and the tensors.
struct FileEntry {
  std::string name;  // a plain file name, no directories
  uint64_t size = 0;
  uint64_t data_start = 0;  // = the header piece's raw length
  Piece header;
  std::vector<std::pair<uint64_t, uint64_t>> fills;  // (file offset, length)
  Piece fill;  // their bytes, concatenated (absent when fills is empty)
  std::vector<TensorEntry> tensors;
  std::vector<Group> groups;
};

struct Manifest {
  bool directory = false;  // the checkpoints were directories (else single files)
  std::vector<FileEntry> files;
  std::vector<std::string> removed_files;    // base files absent from the target
  std::vector<std::string> removed_tensors;  // base tensors absent from the target
};

// Manifest <-> container bytes. Pieces' offsets must already be assigned.
std::vector<uint8_t> SerializeHeaderAndManifest(const Manifest& manifest, uint64_t data_size);

// Reads and validates the header and the manifest of a container.
class Reader {
 public:
  // Errors: kTruncated, kBadMagic, kUnsupportedVersion, kReservedBitsSet,
  // kCorruptHeader (checksums, JSON, ranges, inconsistent fields).
  static Status Open(std::unique_ptr<ByteSource> source, Reader* reader);
  const Manifest& manifest() const { return manifest_; }
  uint64_t data_start() const { return data_start_; }
  uint64_t manifest_size() const { return data_start_ - kHeaderSize; }
  uint16_t version() const { return version_; }  // of the container format, 1 or 2
  const ByteSource& source() const { return *source_; }

  // The stored bytes of a piece or a group, checked against its xxh3 (kCorruptChunk).
  Status ReadPiece(const Piece& piece, std::vector<uint8_t>* scratch, const uint8_t** data) const;
  Status ReadGroup(const Group& group, std::vector<uint8_t>* scratch, const uint8_t** data) const;

 private:
  Status ReadChecked(uint64_t offset, uint64_t size, uint64_t xxh3, const char* what,
                     std::vector<uint8_t>* scratch, const uint8_t** data) const;

  std::unique_ptr<ByteSource> source_;
  Manifest manifest_;
  uint64_t data_start_ = 0;
  uint16_t version_ = 0;
};

// Encodes the change from `base` (nullptr: all zeros, i.e. carry `target` whole) to
// `target`, `bytes` long, elements of `element_size` bytes. arc_v3 for BF16 deltas, else
// the XOR through stored / zstd / zstd of byte planes, whichever is smallest.
// `effort` / `format`: arc_v3 Options::effort / Options::format for BF16 pieces.
Status EncodePiece(const uint8_t* base, const uint8_t* target, uint64_t bytes, size_t element_size,
                   bool bf16, int effort, Piece* piece, std::vector<uint8_t>* out,
                   Format format = Format::kDefault);

// Decodes one piece onto `base` (nullptr: zeros) into `out` (`bytes` long, may not alias
// base), verifying the target checksum. `out` may be clobbered on error.
Status DecodePiece(const Piece& piece, const uint8_t* stored, const uint8_t* base, uint64_t bytes,
                   size_t element_size, uint8_t* out);

// Encodes a group: `base[i]` / `target[i]` are the members' bytes, `bytes[i]` long (BF16,
// any alignment). Sets the group's xxh3, target_xxh3 and size, and `base_xxh3[i]` to the
// hash of each member's base.
Status EncodeGroup(const std::vector<const uint8_t*>& base,
                   const std::vector<const uint8_t*>& target, const std::vector<uint64_t>& bytes,
                   int effort, Group* group, std::vector<uint64_t>* base_xxh3,
                   std::vector<uint8_t>* out);

// delta_worth_grouping of a BF16 tensor's base and target bytes (`bytes` long, any
// alignment: odd ones are copied, so Diff asks only for tensors small enough to group).
bool WorthGrouping(const uint8_t* base, const uint8_t* target, uint64_t bytes);

// Decodes a group's stored bytes onto the members' bases (`base[i]`, `bytes[i]` long, any
// alignment) into `out`: the members' target bytes back to back, verified against the
// group's target_xxh3. `out` may be clobbered on error.
Status DecodeGroup(const Group& group, const uint8_t* stored,
                   const std::vector<const uint8_t*>& base, const std::vector<uint64_t>& bytes,
                   std::vector<uint16_t>* out);

uint64_t Hash(const void* data, size_t size);
// A tensor's checksum: XXH3-64 of its pieces' checksums (u64 little-endian, in order).
uint64_t CombineHashes(const std::vector<uint64_t>& hashes);
std::string HexU64(uint64_t value);

}  // namespace checkpoint
}  // namespace arc_v3

#endif  // ARC_V3_SRC_CHECKPOINT_CONTAINER_H_
