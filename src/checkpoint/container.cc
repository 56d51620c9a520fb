// The checkpoint delta container (see container.h and src/checkpoint/FORMAT.md).
#include "src/checkpoint/container.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "src/checkpoint/strict_json.h"
#include "src/checkpoint/safetensors.h"
#include "src/common/file_io.h"
#include "src/common/status_macros.h"
#include "src/common/xxh3.h"

namespace arc_v3 {
namespace checkpoint {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// zstd level of the generic coder: fast, and XORs of float tensors gain little beyond it.
constexpr int kZstdLevel = 3;
constexpr int kManifestLevel = 9;
// Bounds the memory a hostile manifest can make the reader allocate: its JSON may be at
// most 1 GiB, and at most kManifestRatio times its compressed size above 16 MiB (the
// writer's manifests hold random 64-bit checksums and compress about 2-10x).
constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;
constexpr uint64_t kManifestFloorBytes = uint64_t{1} << 24;
constexpr uint64_t kManifestRatio = 256;
constexpr int kManifestWindowLogMax = 23;  // the writer's level 9 uses at most 2^22
// A zstd frame's blocks regenerate at most 128 KiB each and cost at least 4 bytes (a
// 3-byte header and one RLE byte): no zstd piece produces more than this per stored byte.
constexpr uint64_t kZstdMaxRatio = (uint64_t{128} << 10) / 4;

void PutU16(uint16_t v, uint8_t* p) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
void PutU64(uint64_t v, uint8_t* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t GetU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

Status Corrupt(const std::string& what) {
  return Status(ErrorCode::kCorruptHeader, "delta manifest: " + what);
}

using strict_json::Fail;
using strict_json::Field;
using strict_json::Hex;
using strict_json::Str;
using strict_json::U64;
const auto& CheckKeys = strict_json::CheckFields;

uint64_t CheckedMul(uint64_t a, uint64_t b, const std::string& where) {
  if (a != 0 && b > UINT64_MAX / a) Fail(where + " overflows");
  return a * b;
}
uint64_t CheckedAdd(uint64_t a, uint64_t b, const std::string& where) {
  if (b > UINT64_MAX - a) Fail(where + " overflows");
  return a + b;
}

bool ParseCoder(const std::string& name, Coder* coder) {
  for (Coder c : {Coder::kStored, Coder::kZstd, Coder::kZstdPlanes, Coder::kArcV3}) {
    if (name == CoderName(c)) {
      *coder = c;
      return true;
    }
  }
  return false;
}

OrderedJson PieceToJson(const Piece& p, bool with_base) {
  OrderedJson j;
  j["rows"] = {p.row_begin, p.row_end};
  j["offset"] = p.offset;
  j["size"] = p.size;
  j["coder"] = CoderName(p.coder);
  j["xxh3"] = HexU64(p.xxh3);
  if (with_base) j["base_xxh3"] = HexU64(p.base_xxh3);
  j["target_xxh3"] = HexU64(p.target_xxh3);
  if (p.coder != Coder::kArcV3) j["changed"] = p.changed;
  return j;
}

Piece PieceFromJson(const Json& j, bool with_base, uint64_t data_size, const std::string& where) {
  std::set<std::string> keys = {"rows", "offset",      "size",   "coder",
                                "xxh3", "target_xxh3", "changed"};
  if (with_base) keys.insert("base_xxh3");
  CheckKeys(j, keys, where);
  Piece p;
  const Json& rows = Field(j, "rows", where);
  if (!rows.is_array() || rows.size() != 2) Fail(where + ".rows is not [begin, end]");
  p.row_begin = U64(rows[0], where + ".rows");
  p.row_end = U64(rows[1], where + ".rows");
  if (p.row_begin >= p.row_end) Fail(where + ".rows is empty or reversed");
  p.offset = U64(Field(j, "offset", where), where + ".offset");
  p.size = U64(Field(j, "size", where), where + ".size");
  if (CheckedAdd(p.offset, p.size, where + " byte range") > data_size) {
    Fail(where + " lies beyond the data section");
  }
  if (!ParseCoder(Str(Field(j, "coder", where), where + ".coder"), &p.coder)) {
    Fail(where + " has an unknown coder");
  }
  p.xxh3 = Hex(Field(j, "xxh3", where), where + ".xxh3");
  if (with_base) p.base_xxh3 = Hex(Field(j, "base_xxh3", where), where + ".base_xxh3");
  p.target_xxh3 = Hex(Field(j, "target_xxh3", where), where + ".target_xxh3");
  if (p.coder == Coder::kArcV3) {
    if (j.contains("changed")) Fail(where + ": arc_v3 pieces carry no 'changed'");
  } else {
    p.changed = U64(Field(j, "changed", where), where + ".changed");
  }
  return p;
}

bool PlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// A piece that needs no base must be able to produce its `raw` bytes from its stored
// ones, so that a manifest cannot size outputs beyond what the data section backs.
// arc_v3 pieces and groups code only delta tensors, whose size the base backs.
void CheckBacked(const Piece& p, uint64_t raw, const std::string& where) {
  switch (p.coder) {
    case Coder::kStored:
      if (raw != p.size)
        Fail(where + ": a stored piece of " + std::to_string(p.size) + " bytes cannot produce " +
             std::to_string(raw));
      break;
    case Coder::kZstd:
    case Coder::kZstdPlanes:
      if (p.size < raw / kZstdMaxRatio + (raw % kZstdMaxRatio != 0)) {
        Fail(where + ": a zstd piece of " + std::to_string(p.size) + " bytes cannot produce " +
             std::to_string(raw));
      }
      break;
    case Coder::kArcV3: break;
  }
}

OrderedJson GroupToJson(const Group& g) {
  OrderedJson j;
  j["offset"] = g.offset;
  j["size"] = g.size;
  j["xxh3"] = HexU64(g.xxh3);
  j["target_xxh3"] = HexU64(g.target_xxh3);
  return j;
}

Group GroupFromJson(const Json& j, uint64_t data_size, const std::string& where) {
  CheckKeys(j, {"offset", "size", "xxh3", "target_xxh3"}, where);
  Group g;
  g.offset = U64(Field(j, "offset", where), where + ".offset");
  g.size = U64(Field(j, "size", where), where + ".size");
  if (CheckedAdd(g.offset, g.size, where + " byte range") > data_size) {
    Fail(where + " lies beyond the data section");
  }
  g.xxh3 = Hex(Field(j, "xxh3", where), where + ".xxh3");
  g.target_xxh3 = Hex(Field(j, "target_xxh3", where), where + ".target_xxh3");
  return g;
}

// What parsing a manifest carries from file to file.
struct ManifestParse {
  uint64_t data_size = 0;
  uint16_t version = 0;
  std::set<std::string> file_names, tensor_names;
};

using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;  // (begin, end) in a file

// The fills of `f` (its header parsed) and their fill piece; adds their ranges.
void FillsFromJson(const Json& jf, const std::string& where, uint64_t data_size, FileEntry* f,
                   Ranges* ranges) {
  uint64_t fill_total = 0;
  const Json& fills = Field(jf, "fills", where);
  if (!fills.is_array()) Fail(where + ".fills is not an array");
  for (const Json& r : fills) {
    if (!r.is_array() || r.size() != 2) Fail(where + ".fills entries are [offset, length]");
    const uint64_t at = U64(r[0], where + ".fills"), len = U64(r[1], where + ".fills");
    if (len == 0) Fail(where + " has an empty fill");
    f->fills.emplace_back(at, len);
    ranges->emplace_back(at, CheckedAdd(at, len, where + ".fills"));
    fill_total = CheckedAdd(fill_total, len, where + ".fills");
  }
  if (f->fills.empty()) {
    if (jf.contains("fill")) Fail(where + " has a fill piece but no fills");
  } else {
    f->fill = PieceFromJson(Field(jf, "fill", where), false, data_size, where + ".fill");
    if (f->fill.row_begin != 0 || f->fill.row_end != fill_total) {
      Fail(where + ".fill length differs from the fills");
    }
    CheckBacked(f->fill, fill_total, where + ".fill");
  }
}

TensorKind KindFromJson(const Json& jt, const std::string& twhere) {
  const std::string kind = Str(Field(jt, "kind", twhere), twhere + ".kind");
  if (kind == "delta") return TensorKind::kDelta;
  if (kind == "added") return TensorKind::kAdded;
  if (kind == "reshaped") return TensorKind::kReshaped;
  Fail(twhere + " has unknown kind '" + kind + "'");
}

// A tensor's dtype and shape; returns its size in bytes.
uint64_t ShapeFromJson(const Json& jt, const std::string& twhere, TensorEntry* t) {
  t->dtype = Str(Field(jt, "dtype", twhere), twhere + ".dtype");
  const size_t element_size = safetensors::DTypeSize(t->dtype);
  if (element_size == 0) Fail(twhere + " has unknown dtype '" + t->dtype + "'");
  const Json& shape = Field(jt, "shape", twhere);
  if (!shape.is_array()) Fail(twhere + ".shape is not an array");
  uint64_t elements = 1;
  for (const Json& d : shape) {
    t->shape.push_back(U64(d, twhere + ".shape"));
    elements = CheckedMul(elements, t->shape.back(), twhere + ".shape");
  }
  return CheckedMul(elements, element_size, twhere + " size");
}

// An ungrouped tensor's target checksum and pieces, which must cover its rows in order,
// be backed by their stored bytes and agree with the tensor's checksums.
void PiecesFromJson(const Json& jt, const std::string& twhere, uint64_t bytes, uint64_t data_size,
                    TensorEntry* t) {
  const bool with_base = t->kind == TensorKind::kDelta;
  t->target_xxh3 = Hex(Field(jt, "target_xxh3", twhere), twhere + ".target_xxh3");
  const Json& pieces = Field(jt, "pieces", twhere);
  if (!pieces.is_array()) Fail(twhere + ".pieces is not an array");
  uint64_t next_row = 0;
  std::vector<uint64_t> base_hashes, target_hashes;
  for (const Json& jp : pieces) {
    const std::string pwhere = twhere + " piece #" + std::to_string(t->pieces.size());
    Piece p = PieceFromJson(jp, with_base, data_size, pwhere);
    if (p.row_begin != next_row) Fail(pwhere + " does not continue the previous rows");
    next_row = p.row_end;
    if (p.coder == Coder::kArcV3 && (t->dtype != "BF16" || !with_base)) {
      Fail(pwhere + ": arc_v3 codes only BF16 deltas");
    }
    base_hashes.push_back(p.base_xxh3);
    target_hashes.push_back(p.target_xxh3);
    t->pieces.push_back(p);
  }
  // Zero-element tensors have no pieces; all others are covered row by row.
  if (bytes != 0 && next_row != t->rows()) Fail(twhere + " pieces do not cover its rows");
  if (bytes == 0 && !t->pieces.empty()) Fail(twhere + " is empty but has pieces");
  for (size_t k = 0; k < t->pieces.size(); ++k) {
    const Piece& p = t->pieces[k];
    CheckBacked(p, (p.row_end - p.row_begin) * t->row_bytes(),
                twhere + " piece #" + std::to_string(k));
  }
  if ((with_base && CombineHashes(base_hashes) != t->base_xxh3) ||
      CombineHashes(target_hashes) != t->target_xxh3) {
    Fail(twhere + " checksums disagree with its pieces'");
  }
}

// Makes a grouped tensor (`bytes` long) a member of the group it names.
void JoinGroup(const Json& jt, const std::string& twhere, uint64_t bytes, FileEntry* f,
               TensorEntry* t) {
  // Only version-2 files have groups, so "group" is an unknown field in version 1.
  t->group = U64(Field(jt, "group", twhere), twhere + ".group");
  if (t->group >= f->groups.size()) Fail(twhere + " names a group the file lacks");
  if (t->kind != TensorKind::kDelta || t->dtype != "BF16") {
    Fail(twhere + ": only BF16 deltas are grouped");
  }
  if (bytes == 0) Fail(twhere + " is empty but grouped");
  Group& g = f->groups[t->group];
  g.members.push_back(f->tensors.size());
  g.elements = CheckedAdd(g.elements, bytes / 2, twhere + " group size");
}

// Appends one tensor of file `f` (`where`) and adds its byte range.
void TensorFromJson(const Json& jt, const std::string& where, ManifestParse* parse, FileEntry* f,
                    Ranges* ranges) {
  TensorEntry t;
  t.name = Str(Field(jt, "name", where + " tensor"), where + " tensor name");
  const std::string twhere = "tensor '" + t.name + "'";
  if (!parse->tensor_names.insert(t.name).second) Fail(twhere + " listed twice");
  t.kind = KindFromJson(jt, twhere);
  const bool with_base = t.kind == TensorKind::kDelta;
  const bool grouped = jt.is_object() && jt.contains("group");
  std::set<std::string> keys = {"name", "kind", "dtype", "shape", "data_offset"};
  if (with_base) keys.insert("base_xxh3");
  if (grouped) {
    keys.insert("group");
  } else {
    keys.insert({"target_xxh3", "pieces"});
  }
  CheckKeys(jt, keys, twhere);
  const uint64_t bytes = ShapeFromJson(jt, twhere, &t);
  t.data_offset = U64(Field(jt, "data_offset", twhere), twhere + ".data_offset");
  const uint64_t begin = CheckedAdd(f->data_start, t.data_offset, twhere + " offset");
  ranges->emplace_back(begin, CheckedAdd(begin, bytes, twhere + " range"));
  if (with_base) t.base_xxh3 = Hex(Field(jt, "base_xxh3", twhere), twhere + ".base_xxh3");
  if (grouped) {
    JoinGroup(jt, twhere, bytes, f, &t);
  } else {
    PiecesFromJson(jt, twhere, bytes, parse->data_size, &t);
  }
  f->tensors.push_back(std::move(t));
}

// Every byte of the file is produced exactly once: header, then tensors and fills.
void CheckCoverage(const FileEntry& f, const std::string& where, Ranges ranges) {
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = f.data_start;
  for (const auto& r : ranges) {
    if (r.first == r.second) continue;  // empty tensor
    if (r.first != at) Fail(where + " data section has overlaps or holes");
    at = r.second;
  }
  if (at != f.size) Fail(where + " data section does not end at the file size");
}

FileEntry FileFromJson(const Json& jf, size_t index, ManifestParse* parse) {
  const std::string fwhere = "file #" + std::to_string(index);
  std::set<std::string> file_keys = {"name", "size", "header", "fills", "fill", "tensors"};
  if (parse->version >= 2) file_keys.insert("groups");
  CheckKeys(jf, file_keys, fwhere);
  FileEntry f;
  f.name = Str(Field(jf, "name", fwhere), fwhere + ".name");
  if (!PlainFileName(f.name)) Fail(fwhere + " name '" + f.name + "' is not a plain file name");
  if (!parse->file_names.insert(f.name).second) Fail("file '" + f.name + "' listed twice");
  const std::string where = "file '" + f.name + "'";
  f.size = U64(Field(jf, "size", where), where + ".size");
  f.header = PieceFromJson(Field(jf, "header", where), false, parse->data_size, where + ".header");
  if (f.header.row_begin != 0) Fail(where + ".header must start at row 0");
  f.data_start = f.header.row_end;
  if (f.data_start > f.size) Fail(where + " header is longer than the file");
  CheckBacked(f.header, f.data_start, where + ".header");
  Ranges ranges;
  FillsFromJson(jf, where, parse->data_size, &f, &ranges);
  if (parse->version >= 2) {
    const Json& groups = Field(jf, "groups", where);
    if (!groups.is_array()) Fail(where + ".groups is not an array");
    for (const Json& jg : groups) {
      f.groups.push_back(GroupFromJson(jg, parse->data_size,
                                       where + " group #" + std::to_string(f.groups.size())));
    }
  }
  const Json& tensors = Field(jf, "tensors", where);
  if (!tensors.is_array()) Fail(where + ".tensors is not an array");
  for (const Json& jt : tensors) TensorFromJson(jt, where, parse, &f, &ranges);
  for (size_t g = 0; g < f.groups.size(); ++g) {
    if (f.groups[g].members.empty()) {
      Fail(where + " group #" + std::to_string(g) + " has no tensors");
    }
  }
  CheckCoverage(f, where, std::move(ranges));
  return f;
}

Manifest ManifestFromJson(const Json& root, uint64_t data_size, uint16_t version) {
  CheckKeys(root, {"layout", "files", "removed_files", "removed_tensors"}, "manifest");
  Manifest m;
  const std::string layout = Str(Field(root, "layout", "manifest"), "layout");
  if (layout != "file" && layout != "directory") Fail("layout must be 'file' or 'directory'");
  m.directory = layout == "directory";
  for (const char* key : {"removed_files", "removed_tensors"}) {
    const Json& list = Field(root, key, "manifest");
    if (!list.is_array()) Fail(std::string(key) + " is not an array");
    for (const Json& name : list) {
      (std::string(key) == "removed_files" ? m.removed_files : m.removed_tensors)
          .push_back(Str(name, key));
    }
  }
  const Json& files = Field(root, "files", "manifest");
  if (!files.is_array() || files.empty()) Fail("files is not a non-empty array");
  if (!m.directory && files.size() != 1) Fail("a 'file' layout holds exactly one file");
  ManifestParse parse;
  parse.data_size = data_size;
  parse.version = version;
  for (const Json& jf : files) m.files.push_back(FileFromJson(jf, m.files.size(), &parse));
  // An in-place apply deletes these from the checkpoint directory: plain names only, and
  // never a file the delta writes.
  for (const std::string& name : m.removed_files) {
    if (!m.directory) Fail("a 'file' layout removes no files");
    if (!PlainFileName(name)) Fail("removed file '" + name + "' is not a plain file name");
    if (parse.file_names.count(name) != 0) Fail("file '" + name + "' is both written and removed");
  }
  return m;
}

struct ZstdCCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct ZstdDCtxDeleter {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};
ZSTD_CCtx* ThreadCCtx() {
  thread_local std::unique_ptr<ZSTD_CCtx, ZstdCCtxDeleter> ctx(ZSTD_createCCtx());
  return ctx.get();
}
ZSTD_DCtx* ThreadDCtx() {
  thread_local std::unique_ptr<ZSTD_DCtx, ZstdDCtxDeleter> ctx(ZSTD_createDCtx());
  return ctx.get();
}

// Byte plane k holds byte k of every element: exponent bytes of floats change rarely and
// compress far better apart from the noisy low mantissa bytes.
void SplitPlanes(const uint8_t* in, uint64_t bytes, size_t element_size, uint8_t* out) {
  const uint64_t n = bytes / element_size;
  for (size_t k = 0; k < element_size; ++k) {
    uint8_t* plane = out + k * n;
    for (uint64_t i = 0; i < n; ++i) plane[i] = in[i * element_size + k];
  }
}
void JoinPlanes(const uint8_t* in, uint64_t bytes, size_t element_size, uint8_t* out) {
  const uint64_t n = bytes / element_size;
  for (size_t k = 0; k < element_size; ++k) {
    const uint8_t* plane = in + k * n;
    for (uint64_t i = 0; i < n; ++i) out[i * element_size + k] = plane[i];
  }
}

bool ZstdCompress(const uint8_t* in, size_t size, std::vector<uint8_t>* out) {
  out->resize(ZSTD_compressBound(size));
  const size_t n = ZSTD_compressCCtx(ThreadCCtx(), out->data(), out->size(), in, size, kZstdLevel);
  if (ZSTD_isError(n)) return false;
  out->resize(n);
  return true;
}

}  // namespace

const char* CoderName(Coder coder) {
  switch (coder) {
    case Coder::kStored: return "stored";
    case Coder::kZstd: return "zstd";
    case Coder::kZstdPlanes: return "zstd-planes";
    case Coder::kArcV3: return "arc_v3";
  }
  return "?";
}

const char* TensorKindName(TensorKind kind) {
  switch (kind) {
    case TensorKind::kDelta: return "delta";
    case TensorKind::kAdded: return "added";
    case TensorKind::kReshaped: return "reshaped";
  }
  return "?";
}

uint64_t TensorEntry::row_bytes() const {
  uint64_t n = safetensors::DTypeSize(dtype);
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

uint64_t Hash(const void* data, size_t size) { return XXH3_64bits(data, size); }

uint64_t CombineHashes(const std::vector<uint64_t>& hashes) {
  std::vector<uint8_t> bytes(hashes.size() * 8);
  for (size_t i = 0; i < hashes.size(); ++i) PutU64(hashes[i], bytes.data() + 8 * i);
  return Hash(bytes.data(), bytes.size());
}

std::string HexU64(uint64_t value) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) s[i] = kDigits[value & 15];
  return s;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
}

Status MappedFile::Open(const std::string& path, std::unique_ptr<MappedFile>* file) {
  std::unique_ptr<MappedFile> result(new MappedFile());
  result->path_ = path;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return file_io::Error(path, "cannot open");
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return Status(ErrorCode::kInvalidArgument, path + ": not a regular file");
  }
  result->size_ = static_cast<uint64_t>(st.st_size);
  if (result->size_ > 0) {
    void* map = mmap(nullptr, result->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      close(fd);
      return file_io::Error(path, "cannot map");
    }
    result->data_ = static_cast<const uint8_t*>(map);
  }
  close(fd);
  *file = std::move(result);
  return Status::Ok();
}

Status MappedFile::Read(uint64_t offset, uint64_t size, std::vector<uint8_t>* /*scratch*/,
                        const uint8_t** data) const {
  if (offset > size_ || size > size_ - offset) {
    return Status(ErrorCode::kTruncated, path_ + ": read past the end of the file");
  }
  *data = data_ + offset;
  return Status::Ok();
}

Status MemorySource::Read(uint64_t offset, uint64_t size, std::vector<uint8_t>* /*scratch*/,
                          const uint8_t** data) const {
  if (offset > bytes_.size() || size > bytes_.size() - offset) {
    return Status(ErrorCode::kTruncated, "read past the end of the container");
  }
  *data = bytes_.data() + offset;
  return Status::Ok();
}

std::vector<uint8_t> SerializeHeaderAndManifest(const Manifest& m, uint64_t data_size) {
  bool any_groups = false;
  for (const FileEntry& f : m.files) any_groups = any_groups || !f.groups.empty();
  const uint16_t version = any_groups ? kVersion : kVersionWithoutGroups;
  OrderedJson root;
  root["layout"] = m.directory ? "directory" : "file";
  OrderedJson files = OrderedJson::array();
  for (const FileEntry& f : m.files) {
    OrderedJson jf;
    jf["name"] = f.name;
    jf["size"] = f.size;
    jf["header"] = PieceToJson(f.header, false);
    jf["fills"] = OrderedJson::array();
    for (const auto& r : f.fills) jf["fills"].push_back({r.first, r.second});
    if (!f.fills.empty()) jf["fill"] = PieceToJson(f.fill, false);
    if (version >= 2) {
      jf["groups"] = OrderedJson::array();
      for (const Group& g : f.groups) jf["groups"].push_back(GroupToJson(g));
    }
    OrderedJson tensors = OrderedJson::array();
    for (const TensorEntry& t : f.tensors) {
      const bool with_base = t.kind == TensorKind::kDelta;
      OrderedJson jt;
      jt["name"] = t.name;
      jt["kind"] = TensorKindName(t.kind);
      jt["dtype"] = t.dtype;
      jt["shape"] = t.shape;
      jt["data_offset"] = t.data_offset;
      if (with_base) jt["base_xxh3"] = HexU64(t.base_xxh3);
      if (t.grouped()) {
        jt["group"] = t.group;
        tensors.push_back(std::move(jt));
        continue;
      }
      jt["target_xxh3"] = HexU64(t.target_xxh3);
      jt["pieces"] = OrderedJson::array();
      for (const Piece& p : t.pieces) jt["pieces"].push_back(PieceToJson(p, with_base));
      tensors.push_back(std::move(jt));
    }
    jf["tensors"] = std::move(tensors);
    files.push_back(std::move(jf));
  }
  root["files"] = std::move(files);
  root["removed_files"] = m.removed_files;
  root["removed_tensors"] = m.removed_tensors;
  const std::string text = root.dump();
  // The manifest is mostly names and hex checksums: zstd shrinks it about 3x, which
  // matters for small, sparse deltas.
  std::vector<uint8_t> json(ZSTD_compressBound(text.size()));
  const size_t packed =
      ZSTD_compress(json.data(), json.size(), text.data(), text.size(), kManifestLevel);
  json.resize(ZSTD_isError(packed) ? 0 : packed);  // cannot fail with a bound-sized buffer

  std::vector<uint8_t> out(kHeaderSize + json.size());
  std::memcpy(out.data(), kMagic, 4);
  PutU16(version, out.data() + 4);
  PutU16(0, out.data() + 6);
  PutU64(json.size(), out.data() + 8);
  PutU64(Hash(json.data(), json.size()), out.data() + 16);
  PutU64(data_size, out.data() + 24);
  PutU64(Hash(out.data(), 32), out.data() + 32);
  std::memcpy(out.data() + kHeaderSize, json.data(), json.size());
  return out;
}

namespace {

// The manifest's one zstd frame into `json`, which grows only as output appears (the
// frame header's content size is a claim), up to the cap of kMaxManifestBytes.
Status DecompressManifest(const uint8_t* text, uint64_t size, std::string* json) {
  const std::unique_ptr<ZSTD_DCtx, ZstdDCtxDeleter> ctx(ZSTD_createDCtx());
  if (ctx == nullptr) return Status(ErrorCode::kOutOfMemory, "delta manifest: no zstd context");
  ZSTD_DCtx_setParameter(ctx.get(), ZSTD_d_windowLogMax, kManifestWindowLogMax);
  const uint64_t cap = size >= kMaxManifestBytes / kManifestRatio
                           ? kMaxManifestBytes
                           : std::max(kManifestFloorBytes, kManifestRatio * size);
  ZSTD_inBuffer in = {text, size, 0};
  size_t used = 0;
  for (;;) {
    if (used == json->size()) {
      if (used >= cap) {
        return Corrupt("JSON longer than " + std::to_string(cap) + " bytes (" +
                       std::to_string(size) + " compressed)");
      }
      json->resize(std::min<uint64_t>(cap, std::max<uint64_t>(uint64_t{1} << 16, 2 * used)));
    }
    ZSTD_outBuffer out = {&(*json)[used], json->size() - used, 0};
    const size_t rc = ZSTD_decompressStream(ctx.get(), &out, &in);
    if (ZSTD_isError(rc))
      return Corrupt(std::string("zstd frame does not decode: ") + ZSTD_getErrorName(rc));
    used += out.pos;
    if (rc == 0) break;  // the frame is complete
    if (in.pos == in.size && out.pos < out.size) return Corrupt("zstd frame cut short");
  }
  if (in.pos != in.size) return Corrupt("bytes after the zstd frame");
  // The frame must also state its content size, and state it truly (checked, not used).
  if (ZSTD_getFrameContentSize(text, size) != used) {
    return Corrupt("zstd frame's content size is missing or differs from its content");
  }
  json->resize(used);
  return Status::Ok();
}

}  // namespace

Status Reader::Open(std::unique_ptr<ByteSource> source, Reader* reader) {
  const uint64_t total = source->size();
  if (total < kHeaderSize) {
    return Status(ErrorCode::kTruncated, "delta file is " + std::to_string(total) +
                                             " bytes, shorter than its 40-byte header");
  }
  std::vector<uint8_t> scratch;
  const uint8_t* h = nullptr;
  ARC_V3_RETURN_IF_ERROR(source->Read(0, kHeaderSize, &scratch, &h));
  if (std::memcmp(h, kMagic, 4) != 0) {
    return Status(ErrorCode::kBadMagic, "not an arc_v3 delta container (magic is not 'A3DC')");
  }
  const uint16_t version = GetU16(h + 4);
  if (version < 1 || version > kVersion) {
    return Status(ErrorCode::kUnsupportedVersion,
                  "delta container version " + std::to_string(version) + " (this tool reads 1 to " +
                      std::to_string(kVersion) + ")");
  }
  if (GetU64(h + 32) != Hash(h, 32)) {
    return Status(ErrorCode::kCorruptHeader, "delta container header checksum mismatch");
  }
  if (GetU16(h + 6) != 0) {
    return Status(ErrorCode::kReservedBitsSet, "delta container flags (reserved) are not zero");
  }
  const uint64_t manifest_size = GetU64(h + 8);
  const uint64_t manifest_hash = GetU64(h + 16);
  const uint64_t data_size = GetU64(h + 24);
  if (manifest_size > total || data_size > total ||
      kHeaderSize + manifest_size + data_size != total) {
    const bool shorter = manifest_size > total || data_size > total ||
                         kHeaderSize + manifest_size + data_size > total;
    return Status(shorter ? ErrorCode::kTruncated : ErrorCode::kCorruptHeader,
                  "delta file is " + std::to_string(total) + " bytes but its header says " +
                      (shorter ? "more (truncated?)" : "fewer (trailing bytes)"));
  }
  const uint8_t* text = nullptr;
  ARC_V3_RETURN_IF_ERROR(source->Read(kHeaderSize, manifest_size, &scratch, &text));
  if (Hash(text, manifest_size) != manifest_hash) {
    return Status(ErrorCode::kCorruptHeader, "delta manifest checksum mismatch (corrupt file)");
  }
  std::string json;
  ARC_V3_RETURN_IF_ERROR(DecompressManifest(text, manifest_size, &json));
  try {
    Json root;
    try {
      root = strict_json::Parse(json, "the manifest");
    } catch (const Json::exception&) {
      return Corrupt("not valid JSON");
    }
    reader->manifest_ = ManifestFromJson(root, data_size, version);
  } catch (const strict_json::Error& e) {
    return Corrupt(e.what);
  } catch (const std::exception& e) {  // nlohmann type errors, allocation
    return Corrupt(e.what());
  }
  reader->data_start_ = kHeaderSize + manifest_size;
  reader->version_ = version;
  reader->source_ = std::move(source);
  return Status::Ok();
}

Status Reader::ReadChecked(uint64_t offset, uint64_t size, uint64_t xxh3, const char* what,
                           std::vector<uint8_t>* scratch, const uint8_t** data) const {
  ARC_V3_RETURN_IF_ERROR(source_->Read(data_start_ + offset, size, scratch, data));
  if (Hash(*data, size) != xxh3) {
    return Status(ErrorCode::kCorruptChunk,
                  std::string(what) + " bytes checksum mismatch (corrupt delta)");
  }
  return Status::Ok();
}

Status Reader::ReadPiece(const Piece& piece, std::vector<uint8_t>* scratch,
                         const uint8_t** data) const {
  return ReadChecked(piece.offset, piece.size, piece.xxh3, "piece", scratch, data);
}

Status Reader::ReadGroup(const Group& group, std::vector<uint8_t>* scratch,
                         const uint8_t** data) const {
  return ReadChecked(group.offset, group.size, group.xxh3, "group", scratch, data);
}

namespace {

bool AnyOdd(const std::vector<const uint8_t*>& pointers) {
  for (const uint8_t* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) & 1) return true;
  }
  return false;
}

// The members' bytes as BF16 arrays: the pointers themselves when all are 2-byte aligned
// (as in safetensors files the writers align), else aligned copies, back to back.
std::vector<const uint16_t*> AlignedMembers(const std::vector<const uint8_t*>& members,
                                            const std::vector<uint64_t>& bytes,
                                            std::vector<uint16_t>* copy) {
  std::vector<const uint16_t*> result(members.size());
  if (!AnyOdd(members)) {
    for (size_t i = 0; i < members.size(); ++i) {
      result[i] = reinterpret_cast<const uint16_t*>(members[i]);
    }
    return result;
  }
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b / 2;
  copy->resize(total);
  uint64_t at = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    std::memcpy(copy->data() + at, members[i], bytes[i]);
    result[i] = copy->data() + at;
    at += bytes[i] / 2;
  }
  return result;
}

}  // namespace

Status EncodeGroup(const std::vector<const uint8_t*>& base,
                   const std::vector<const uint8_t*>& target, const std::vector<uint64_t>& bytes,
                   int effort, Group* group, std::vector<uint64_t>* base_xxh3,
                   std::vector<uint8_t>* out) {
  std::vector<uint16_t> base_copy, target_copy;
  const std::vector<const uint16_t*> src = AlignedMembers(base, bytes, &base_copy);
  const std::vector<const uint16_t*> dst = AlignedMembers(target, bytes, &target_copy);
  std::vector<TensorDelta> tensors(base.size());
  base_xxh3->resize(base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    tensors[i].src = src[i];
    tensors[i].dst = dst[i];
    tensors[i].count = bytes[i] / 2;
    (*base_xxh3)[i] = Hash(base[i], bytes[i]);
  }
  Options options;
  options.threads = 1;  // the caller runs pieces and groups in parallel
  options.effort = effort;
  Delta delta;
  ARC_V3_RETURN_IF_ERROR(delta_compress_tensors(tensors.data(), tensors.size(), &delta, options));
  group->target_xxh3 = delta.checksum;
  *out = std::move(delta.bytes);
  group->xxh3 = Hash(out->data(), out->size());
  group->size = out->size();
  return Status::Ok();
}

bool WorthGrouping(const uint8_t* base, const uint8_t* target, uint64_t bytes) {
  std::vector<uint16_t> base_copy, target_copy;
  const std::vector<const uint16_t*> src = AlignedMembers({base}, {bytes}, &base_copy);
  const std::vector<const uint16_t*> dst = AlignedMembers({target}, {bytes}, &target_copy);
  return delta_worth_grouping(src[0], dst[0], bytes / 2);
}

Status DecodeGroup(const Group& group, const uint8_t* stored,
                   const std::vector<const uint8_t*>& base, const std::vector<uint64_t>& bytes,
                   std::vector<uint16_t>* out) {
  std::vector<uint16_t> base_copy;
  const std::vector<const uint16_t*> src = AlignedMembers(base, bytes, &base_copy);
  uint64_t total = 0;
  for (uint64_t b : bytes) total += b / 2;
  out->resize(total);
  std::vector<TensorOut> tensors(base.size());
  uint64_t at = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    tensors[i].src = src[i];
    tensors[i].out = out->data() + at;
    tensors[i].count = bytes[i] / 2;
    at += tensors[i].count;
  }
  Status s = delta_decompress_tensors(tensors.data(), tensors.size(), stored, group.size,
                                      group.target_xxh3, /*threads=*/1);
  if (s.code() == ErrorCode::kChecksumMismatch) {
    return Status(ErrorCode::kCorruptChunk,
                  "decoded group differs from the target checksum (corrupt delta)");
  }
  if (s.code() == ErrorCode::kSizeMismatch) {
    // The manifest's member list disagrees with the payload's own.
    return Status(ErrorCode::kCorruptChunk, "group payload: " + s.message());
  }
  if (!s.ok()) return Status(s.code(), "group payload: " + s.message());
  return Status::Ok();
}

Status EncodePiece(const uint8_t* base, const uint8_t* target, uint64_t bytes, size_t element_size,
                   bool bf16, int effort, Piece* piece, std::vector<uint8_t>* out, Format format) {
  if (bf16 && base != nullptr) {
    const size_t count = bytes / 2;
    // Tensors of a safetensors file need not be 2-byte aligned; the codec wants them so.
    std::vector<uint16_t> aligned_base, aligned_target;
    const uint16_t* src = AlignedMembers({base}, {bytes}, &aligned_base)[0];
    const uint16_t* dst = AlignedMembers({target}, {bytes}, &aligned_target)[0];
    Options options;
    options.threads = 1;  // the caller runs pieces in parallel
    options.effort = effort;
    options.format = format;
    Delta delta;
    // The encoder hashes src as it goes: one pass over memory instead of two.
    ARC_V3_RETURN_IF_ERROR(delta_compress(src, dst, count, &delta, options, &piece->base_xxh3));
    piece->coder = Coder::kArcV3;
    piece->target_xxh3 = delta.checksum;  // XXH3 of the target rows, as below
    *out = std::move(delta.bytes);
    piece->xxh3 = Hash(out->data(), out->size());
    piece->size = out->size();
    return Status::Ok();
  }
  piece->base_xxh3 = base != nullptr ? Hash(base, bytes) : 0;
  piece->target_xxh3 = Hash(target, bytes);
  std::vector<uint8_t> xored(target, target + bytes);
  if (base != nullptr) {
    for (uint64_t i = 0; i < bytes; ++i) xored[i] ^= base[i];
  }
  uint64_t changed = 0;
  for (uint64_t i = 0; i < bytes; i += element_size) {
    uint8_t any = 0;
    for (size_t k = 0; k < element_size; ++k) any |= xored[i + k];
    changed += any != 0;
  }
  piece->changed = changed;
  std::vector<uint8_t> plain, planes;
  if (!ZstdCompress(xored.data(), bytes, &plain)) {
    return Status(ErrorCode::kCodecFailure, "zstd failed");
  }
  piece->coder = Coder::kZstd;
  if (element_size > 1) {
    std::vector<uint8_t> split(bytes);
    SplitPlanes(xored.data(), bytes, element_size, split.data());
    if (!ZstdCompress(split.data(), bytes, &planes)) {
      return Status(ErrorCode::kCodecFailure, "zstd failed");
    }
    if (planes.size() < plain.size()) {
      piece->coder = Coder::kZstdPlanes;
      plain.swap(planes);
    }
  }
  if (plain.size() >= bytes) {
    piece->coder = Coder::kStored;
    plain.swap(xored);
  }
  *out = std::move(plain);
  piece->xxh3 = Hash(out->data(), out->size());
  piece->size = out->size();
  return Status::Ok();
}

Status DecodePiece(const Piece& piece, const uint8_t* stored, const uint8_t* base, uint64_t bytes,
                   size_t element_size, uint8_t* out) {
  const Status mismatch(ErrorCode::kCorruptChunk,
                        "decoded rows differ from the target checksum (corrupt delta)");
  if (piece.coder == Coder::kArcV3) {
    if (base == nullptr || bytes % 2 != 0) {
      return Status(ErrorCode::kCorruptChunk, "arc_v3 piece without a BF16 base");
    }
    const size_t count = bytes / 2;
    std::vector<uint16_t> aligned_base;
    const uint16_t* src = AlignedMembers({base}, {bytes}, &aligned_base)[0];
    // `out` comes from the caller's aligned buffers.
    Status s = delta_decompress(src, count, stored, piece.size, piece.target_xxh3,
                                reinterpret_cast<uint16_t*>(out), count, /*threads=*/1);
    if (s.code() == ErrorCode::kChecksumMismatch) return mismatch;
    if (!s.ok()) return Status(s.code(), "arc_v3 piece: " + s.message());
    return Status::Ok();
  }
  std::vector<uint8_t> planes;
  switch (piece.coder) {
    case Coder::kStored:
      if (piece.size != bytes)
        return Status(ErrorCode::kCorruptChunk, "stored piece has the wrong size");
      std::memcpy(out, stored, bytes);
      break;
    case Coder::kZstd:
    case Coder::kZstdPlanes: {
      uint8_t* dst = out;
      if (piece.coder == Coder::kZstdPlanes) {
        planes.resize(bytes);
        dst = planes.data();
      }
      const unsigned long long content = ZSTD_getFrameContentSize(stored, piece.size);
      if (content != bytes)
        return Status(ErrorCode::kCorruptChunk, "zstd piece has the wrong size");
      const size_t n = ZSTD_decompressDCtx(ThreadDCtx(), dst, bytes, stored, piece.size);
      if (ZSTD_isError(n) || n != bytes) {
        return Status(ErrorCode::kCodecFailure, "zstd piece does not decode");
      }
      if (piece.coder == Coder::kZstdPlanes) {
        if (bytes % element_size != 0) return Status(ErrorCode::kCorruptChunk, "bad plane split");
        JoinPlanes(planes.data(), bytes, element_size, out);
      }
      break;
    }
    case Coder::kArcV3: break;
  }
  if (base != nullptr) {
    for (uint64_t i = 0; i < bytes; ++i) out[i] ^= base[i];
  }
  if (Hash(out, bytes) != piece.target_xxh3) return mismatch;
  return Status::Ok();
}

}  // namespace checkpoint
}  // namespace arc_v3
