// pybind11 binding of the arc_v3 C API: the thin, buffer-level layer under the Python
// package (arc_v3/__init__.py turns tensors and arrays into buffers and back).
//
// Every function takes Python buffers (numpy arrays, bytes, bytearray, memoryview) and
// works on their memory directly: no copies in, the GIL released while the codec runs.
// Codec errors become arc_v3.ArcV3Error (code, name, message); misuse of this layer
// (wrong item size, read-only output) raises ValueError / TypeError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "arc_v3.hpp"
#include "arc_v3_sync.hpp"
#include "arc_v3_checkpoint.hpp"

namespace py = pybind11;

namespace {

// Thrown with the codec's Status; translated into arc_v3.ArcV3Error.
struct CodecError {
  arc_v3::Status status;
};

// A 2-byte-element view of a Python buffer, held (and the exporter locked) while alive.
struct U16View {
  py::buffer_info info;
  const uint16_t* data = nullptr;
  size_t count = 0;
};

// Accepts any C-contiguous buffer whose size is a whole number of BF16 values: numpy
// uint16/int16 arrays, or raw bytes read as little-endian BF16 bit patterns.
U16View ViewU16(const py::buffer& buffer, const char* what, bool writable) {
  U16View view;
  // PyBUF_ND|STRIDES|FORMAT via pybind11; contiguity is checked below so that a strided
  // view is refused instead of silently read wrongly.
  view.info = buffer.request(writable);
  const py::ssize_t bytes = view.info.size * view.info.itemsize;
  if (view.info.itemsize != 1 && view.info.itemsize != 2) {
    throw py::type_error(std::string(what) + ": expected 2-byte elements (uint16/bfloat16) " +
                         "or raw bytes, got item size " + std::to_string(view.info.itemsize));
  }
  py::ssize_t expected_stride = view.info.itemsize;
  for (py::ssize_t d = view.info.ndim - 1; d >= 0; --d) {
    if (view.info.shape[d] > 1 && view.info.strides[d] != expected_stride) {
      throw py::value_error(std::string(what) + ": buffer must be C-contiguous");
    }
    expected_stride *= view.info.shape[d];
  }
  if (bytes % 2 != 0) {
    throw py::value_error(std::string(what) + ": size in bytes (" + std::to_string(bytes) +
                          ") is odd; BF16 values are 2 bytes");
  }
  view.data = static_cast<const uint16_t*>(view.info.ptr);
  view.count = static_cast<size_t>(bytes / 2);
  return view;
}

// The stateless decoders' one error for a wrong base (python/README.md, "Errors"). A
// stateless payload holds the checksum of its result, not of its base: the library
// reports a wrong base as kChecksumMismatch when the result is hashed, or, first, as
// kCorruptChunk when a modelled or rANS chunk, which predicts from the base, derails
// (src/codec/FORMAT.md, "Errors"). Both are checksum_mismatch here, with the library's own error in
// the message. Errors the payload's bytes show without the base keep their code:
// truncated, bad_magic, unsupported_version, reserved_bits_set, corrupt_header,
// codec_failure (a zstd/LZ4 stream of XOR fields, which do not depend on the base), and
// size_mismatch. Session payloads name their base (kWrongBase before any chunk is
// decoded), and the state-dict container checks each piece's base: neither needs this.
arc_v3::Status AsWrongBase(const arc_v3::Status& status) {
  if (status.code() != arc_v3::ErrorCode::kCorruptChunk) return status;
  return arc_v3::Status(arc_v3::ErrorCode::kChecksumMismatch,
                        std::string("does not decode against this base: wrong base or damaged "
                                    "payload (") +
                            arc_v3::ErrorName(status.code()) + ": " + status.message() + ")");
}

// Runs an encoder call without the GIL; returns (payload bytes, checksum).
template <class Encode>
py::tuple RunEncoder(int format, int effort, int threads, uint32_t chunk_elements,
                     const Encode& encode) {
  if (format < 0 || format > 255) throw py::value_error("format out of range");
  arc_v3::Options options;
  options.format = static_cast<arc_v3::Format>(format);
  options.effort = effort;
  options.threads = threads;
  options.chunk_elements = chunk_elements;
  arc_v3::Delta delta;
  arc_v3::Status status;
  {
    py::gil_scoped_release release;
    status = encode(options, &delta);
  }
  if (!status.ok()) throw CodecError{status};
  py::bytes payload(reinterpret_cast<const char*>(delta.bytes.data()), delta.bytes.size());
  return py::make_tuple(std::move(payload), delta.checksum);
}

py::tuple Compress(const py::buffer& src, const py::buffer& dst, int format, int effort,
                   int threads, uint32_t chunk_elements) {
  const U16View s = ViewU16(src, "src", false);
  const U16View d = ViewU16(dst, "dst", false);
  if (s.count != d.count) {
    throw py::value_error("src and dst differ in length: " + std::to_string(s.count) + " vs " +
                          std::to_string(d.count) + " values");
  }
  return RunEncoder(format, effort, threads, chunk_elements,
                    [&](const arc_v3::Options& options, arc_v3::Delta* delta) {
                      return arc_v3::delta_compress(s.data, d.data, s.count, delta, options);
                    });
}

bool WorthGrouping(const py::buffer& src, const py::buffer& dst) {
  const U16View s = ViewU16(src, "src", false);
  const U16View d = ViewU16(dst, "dst", false);
  if (s.count != d.count) {
    throw py::value_error("src and dst differ in length: " + std::to_string(s.count) + " vs " +
                          std::to_string(d.count) + " values");
  }
  py::gil_scoped_release release;
  return arc_v3::delta_worth_grouping(s.data, d.data, s.count);
}

void DecompressInto(const py::buffer& src, const py::buffer& payload, uint64_t checksum,
                    const py::buffer& out, int threads) {
  const U16View s = ViewU16(src, "src", false);
  const py::buffer_info p = payload.request();
  // Requesting out writable fails (BufferError) for read-only memory such as bytes.
  const U16View o = ViewU16(out, "out", true);
  if (o.count != s.count) {
    throw py::value_error("out holds " + std::to_string(o.count) + " values, src " +
                          std::to_string(s.count));
  }
  const auto* bytes = static_cast<const uint8_t*>(p.ptr);
  const size_t size = static_cast<size_t>(p.size * p.itemsize);
  arc_v3::Status status;
  {
    py::gil_scoped_release release;
    status = arc_v3::delta_decompress(s.data, s.count, bytes, size, checksum,
                                      const_cast<uint16_t*>(o.data), o.count, threads);
  }
  if (!status.ok()) throw CodecError{AsWrongBase(status)};
}

// Decodes into a fresh bytes object (the raw-buffer path: bytes in, bytes out). The
// object is not visible to Python until returned, so writing into it is allowed.
py::bytes DecompressToBytes(const py::buffer& src, const py::buffer& payload, uint64_t checksum,
                            int threads) {
  const U16View s = ViewU16(src, "src", false);
  const py::buffer_info p = payload.request();
  PyObject* raw = PyBytes_FromStringAndSize(nullptr, static_cast<py::ssize_t>(s.count * 2));
  if (raw == nullptr) throw py::error_already_set();
  py::bytes result = py::reinterpret_steal<py::bytes>(raw);
  auto* out = reinterpret_cast<uint16_t*>(PyBytes_AS_STRING(raw));
  arc_v3::Status status;
  {
    py::gil_scoped_release release;
    status = arc_v3::delta_decompress(s.data, s.count, static_cast<const uint8_t*>(p.ptr),
                                      static_cast<size_t>(p.size * p.itemsize), checksum, out,
                                      s.count, threads);
  }
  if (!status.ok()) throw CodecError{AsWrongBase(status)};
  return result;
}

// Views of two lists of buffers, pairwise of equal length (`second`: "dst" or a writable
// "out"); `views` holds them (and so the buffers) until the call returns.
void ViewPairs(const py::list& srcs, const py::list& seconds, const char* second, bool writable,
               std::vector<U16View>* views) {
  if (srcs.size() != seconds.size()) {
    throw py::value_error("srcs and " + std::string(second) +
                          "s differ in length: " + std::to_string(srcs.size()) + " vs " +
                          std::to_string(seconds.size()) + " tensors");
  }
  views->reserve(2 * srcs.size());
  for (size_t t = 0; t < srcs.size(); ++t) {
    const std::string name = "tensor " + std::to_string(t);
    views->push_back(ViewU16(srcs[t].cast<py::buffer>(), (name + " src").c_str(), false));
    views->push_back(
        ViewU16(seconds[t].cast<py::buffer>(), (name + " " + second).c_str(), writable));
    const size_t a = (*views)[2 * t].count, b = (*views)[2 * t + 1].count;
    if (a != b) {
      throw py::value_error(name + ": src holds " + std::to_string(a) + " values, " + second + " " +
                            std::to_string(b));
    }
  }
}

// The tensor lists of the codec calls, from ViewPairs' views (src, second, src, ...).
std::vector<arc_v3::TensorDelta> TensorDeltas(const std::vector<U16View>& views) {
  std::vector<arc_v3::TensorDelta> tensors;
  for (size_t t = 0; 2 * t < views.size(); ++t) {
    tensors.push_back({views[2 * t].data, views[2 * t + 1].data, views[2 * t].count});
  }
  return tensors;
}
std::vector<arc_v3::TensorOut> TensorOuts(const std::vector<U16View>& views) {
  std::vector<arc_v3::TensorOut> tensors;
  for (size_t t = 0; 2 * t < views.size(); ++t) {
    tensors.push_back(
        {views[2 * t].data, const_cast<uint16_t*>(views[2 * t + 1].data), views[2 * t].count});
  }
  return tensors;
}

// Several tensors in one payload (arc_v3::delta_compress_tensors): lists of src and dst
// buffers, pairwise of equal length.
py::tuple CompressTensors(const py::list& srcs, const py::list& dsts, int format, int effort,
                          int threads, uint32_t chunk_elements) {
  std::vector<U16View> views;
  ViewPairs(srcs, dsts, "dst", false, &views);
  const std::vector<arc_v3::TensorDelta> tensors = TensorDeltas(views);
  return RunEncoder(format, effort, threads, chunk_elements,
                    [&](const arc_v3::Options& options, arc_v3::Delta* delta) {
                      return arc_v3::delta_compress_tensors(tensors.data(), tensors.size(), delta,
                                                            options);
                    });
}

// Rebuilds every tensor of such a payload into the writable `outs` (all or none).
void DecompressTensorsInto(const py::list& srcs, const py::buffer& payload, uint64_t checksum,
                           const py::list& outs, int threads) {
  std::vector<U16View> views;
  ViewPairs(srcs, outs, "out", true, &views);
  const std::vector<arc_v3::TensorOut> tensors = TensorOuts(views);
  const py::buffer_info p = payload.request();
  arc_v3::Status status;
  {
    py::gil_scoped_release release;
    status = arc_v3::delta_decompress_tensors(
        tensors.data(), tensors.size(), static_cast<const uint8_t*>(p.ptr),
        static_cast<size_t>(p.size * p.itemsize), checksum, threads);
  }
  if (!status.ok()) throw CodecError{AsWrongBase(status)};
}

// arc_v3::Session behind the Python arc_v3.Session: the same buffer-level calls as the
// functions above, on one session's history. Not thread-safe (one step at a time).
class PySession {
 public:
  PySession(int effort, int threads, uint32_t chunk_elements) {
    arc_v3::Options options;
    options.effort = effort;
    options.threads = threads;
    options.chunk_elements = chunk_elements;
    session_ = arc_v3::Session(options);
  }

  py::tuple Compress(const py::buffer& src, const py::buffer& dst) {
    const U16View s = ViewU16(src, "src", false);
    const U16View d = ViewU16(dst, "dst", false);
    if (s.count != d.count) {
      throw py::value_error("src and dst differ in length: " + std::to_string(s.count) + " vs " +
                            std::to_string(d.count) + " values");
    }
    return Run(
        [&](arc_v3::Delta* delta) { return session_.Compress(s.data, d.data, s.count, delta); });
  }

  void DecompressInto(const py::buffer& src, const py::buffer& payload, uint64_t checksum,
                      const py::buffer& out) {
    const U16View s = ViewU16(src, "src", false);
    const U16View o = ViewU16(out, "out", true);
    if (o.count != s.count) {
      throw py::value_error("out holds " + std::to_string(o.count) + " values, src " +
                            std::to_string(s.count));
    }
    const py::buffer_info p = payload.request();
    Check([&] {
      return session_.Decompress(s.data, s.count, static_cast<const uint8_t*>(p.ptr),
                                 static_cast<size_t>(p.size * p.itemsize), checksum,
                                 const_cast<uint16_t*>(o.data));
    });
  }

  py::tuple CompressTensors(const py::list& srcs, const py::list& dsts) {
    std::vector<U16View> views;
    ViewPairs(srcs, dsts, "dst", false, &views);
    const std::vector<arc_v3::TensorDelta> tensors = TensorDeltas(views);
    return Run([&](arc_v3::Delta* delta) {
      return session_.CompressTensors(tensors.data(), tensors.size(), delta);
    });
  }

  void DecompressTensorsInto(const py::list& srcs, const py::buffer& payload, uint64_t checksum,
                             const py::list& outs) {
    std::vector<U16View> views;
    ViewPairs(srcs, outs, "out", true, &views);
    const std::vector<arc_v3::TensorOut> tensors = TensorOuts(views);
    const py::buffer_info p = payload.request();
    Check([&] {
      return session_.DecompressTensors(tensors.data(), tensors.size(),
                                        static_cast<const uint8_t*>(p.ptr),
                                        static_cast<size_t>(p.size * p.itemsize), checksum);
    });
  }

  uint64_t steps() const { return session_.steps(); }
  uint64_t history_id() const { return session_.history_id(); }
  void Reset() { session_.Reset(); }

 private:
  template <class Call>
  void Check(const Call& call) {
    arc_v3::Status status;
    {
      py::gil_scoped_release release;
      status = call();
    }
    if (!status.ok()) throw CodecError{status};
  }
  template <class Call>
  py::tuple Run(const Call& call) {
    arc_v3::Delta delta;
    Check([&] { return call(&delta); });
    py::bytes payload(reinterpret_cast<const char*>(delta.bytes.data()), delta.bytes.size());
    return py::make_tuple(std::move(payload), delta.checksum);
  }

  arc_v3::Session session_;
};

py::dict Inspect(const py::buffer& payload) {
  const py::buffer_info p = payload.request();
  arc_v3::PayloadInfo info;
  const arc_v3::Status status = arc_v3::delta_inspect(
      static_cast<const uint8_t*>(p.ptr), static_cast<size_t>(p.size * p.itemsize), &info);
  if (!status.ok()) throw CodecError{status};
  py::dict result;
  result["format_version"] = info.format_version;
  result["element_count"] = info.element_count;
  result["chunk_elements"] = info.chunk_elements;
  result["chunk_count"] = info.chunk_count;
  result["tensor_count"] = info.tensor_count;
  result["session"] = info.session;
  result["continues"] = info.continues;
  return result;
}

// XXH3-64 (seed 0) of any buffer's bytes: equals the codec's checksum for BF16 data, and
// serves the state-dict helpers for other dtypes.
uint64_t Xxh3(const py::buffer& buffer) {
  const py::buffer_info b = buffer.request();
  const size_t size = static_cast<size_t>(b.size * b.itemsize);
  py::gil_scoped_release release;
  return XXH3_64bits(b.ptr, size);
}

// The checkpoint delta container (src/checkpoint/FORMAT.md) on safetensors files, for the
// state-dict helpers (arc_v3/_dicts.py), which write the files into a private temporary
// directory. Outputs are not fsynced: those files are deleted right after the call.

// What a container's manifest says, checked but without decoding pieces:
// {"layout", "removed_tensors", "tensors": [{"name", "kind", "dtype", "shape", "coders"}]}.
py::dict ContainerManifest(const py::buffer& container) {
  const py::buffer_info b = container.request();
  arc_v3::DeltaInfo info;
  const arc_v3::Status status = arc_v3::InspectDelta(
      static_cast<const uint8_t*>(b.ptr), static_cast<size_t>(b.size * b.itemsize), &info);
  if (!status.ok()) throw CodecError{status};
  py::list tensors;
  for (const arc_v3::DeltaTensorInfo& t : info.tensors) {
    py::dict entry;
    entry["name"] = t.name;
    entry["kind"] = t.kind;
    entry["dtype"] = t.dtype;
    entry["shape"] = py::tuple(py::cast(t.shape));
    entry["coders"] = py::cast(t.coders);
    entry["group"] = t.group >= 0 ? py::object(py::int_(t.group)) : py::object(py::none());
    tensors.append(entry);
  }
  py::dict result;
  result["layout"] = info.directory ? "directory" : "file";
  result["container_version"] = info.container_version;
  result["removed_tensors"] = py::cast(info.removed_tensors);
  result["tensors"] = tensors;
  return result;
}

// For python/bench/bench_binding.py: wall times in seconds of `repeats` direct C++ calls
// on the same buffers (the best of each), so that the binding's overhead is measured
// against the very same compiled codec. Returns a dict:
//   compress:        delta_compress on the pointers;
//   decompress_into: delta_decompress into one preallocated buffer (as out=);
//   decompress_new:  the std::vector overload, which allocates the result per call.
py::dict TimeDirect(const py::buffer& src, const py::buffer& dst, int format, int threads,
                    int repeats) {
  const U16View s = ViewU16(src, "src", false);
  const U16View d = ViewU16(dst, "dst", false);
  if (s.count != d.count) throw py::value_error("src and dst differ in length");
  arc_v3::Options options;
  options.format = static_cast<arc_v3::Format>(format);
  options.threads = threads;
  double best[3] = {1e30, 1e30, 1e30};
  arc_v3::Status status;
  {
    py::gil_scoped_release release;
    arc_v3::Delta delta;
    std::vector<uint16_t> out(s.count), src_vector(s.data, s.data + s.count), fresh;
    using Clock = std::chrono::steady_clock;
    auto seconds = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double>(b - a).count();
    };
    for (int r = 0; r < repeats && status.ok(); ++r) {
      const auto t0 = Clock::now();
      status = arc_v3::delta_compress(s.data, d.data, s.count, &delta, options);
      const auto t1 = Clock::now();
      if (!status.ok()) break;
      status = arc_v3::delta_decompress(s.data, s.count, delta.bytes.data(), delta.bytes.size(),
                                        delta.checksum, out.data(), out.size(), threads);
      const auto t2 = Clock::now();
      if (!status.ok()) break;
      fresh = std::vector<uint16_t>();  // freed, so the next result is fresh memory again
      status = arc_v3::delta_decompress(src_vector, delta, &fresh);
      const auto t3 = Clock::now();
      best[0] = std::min(best[0], seconds(t0, t1));
      best[1] = std::min(best[1], seconds(t1, t2));
      best[2] = std::min(best[2], seconds(t2, t3));
    }
  }
  if (!status.ok()) throw CodecError{status};
  py::dict result;
  result["compress"] = best[0];
  result["decompress_into"] = best[1];
  result["decompress_new"] = best[2];
  return result;
}

// A trainer rank's tensors as the C++ roles take them: (name, dtype, shape, buffer)
// tuples, the buffers held (and locked) while the call runs.
struct HeldBuffers {
  std::vector<py::buffer_info> infos;
  std::vector<arc_v3::NamedTensor> tensors;
};

HeldBuffers ReadTensors(const py::list& items) {
  HeldBuffers held;
  held.infos.reserve(items.size());
  for (const py::handle& item : items) {
    const py::tuple t = py::reinterpret_borrow<py::tuple>(item);
    if (t.size() != 4) throw py::value_error("expected (name, dtype, shape, buffer) tuples");
    held.infos.push_back(py::reinterpret_borrow<py::buffer>(t[3]).request(false));
    arc_v3::NamedTensor n;
    n.name = t[0].cast<std::string>();
    n.dtype = t[1].cast<std::string>();
    n.shape = t[2].cast<std::vector<uint64_t>>();
    n.data = held.infos.back().ptr;
    uint64_t bytes = static_cast<uint64_t>(held.infos.back().size * held.infos.back().itemsize);
    uint64_t expected = arc_v3::DtypeSize(n.dtype);
    for (uint64_t d : n.shape) expected *= d;
    if (bytes != expected) {
      throw py::value_error("tensor '" + n.name + "': " + std::to_string(bytes) +
                            " bytes, its dtype and shape need " + std::to_string(expected));
    }
    held.tensors.push_back(std::move(n));
  }
  return held;
}

arc_v3::StoreSettings Settings(int retries, int connections) {
  arc_v3::StoreSettings s;
  s.retries = retries;
  s.connections = connections;
  return s;
}

// The container of `next` against `prev` (lists of (name, dtype, shape, buffer)): what
// `arc_v3 diff` writes for them saved as single safetensors files, built in memory.
py::bytes DictsDiff(const py::list& prev, const py::list& next, int format, int effort,
                    int threads) {
  const HeldBuffers p = ReadTensors(prev), n = ReadTensors(next);
  arc_v3::StateDictOptions options;
  options.format = static_cast<arc_v3::Format>(format);
  options.effort = effort;
  options.threads = threads;
  std::vector<uint8_t> delta;
  arc_v3::Status status;
  {
    py::gil_scoped_release release;
    status = arc_v3::StateDictDiff(p.tensors, n.tensors, options, &delta);
  }
  if (!status.ok()) throw CodecError{status};
  return py::bytes(reinterpret_cast<const char*>(delta.data()), delta.size());
}

// Rebuilds a single-file container's tensors from `prev` into new memory that
// allocate(name, dtype, shape) gives (a writable buffer of the tensor's bytes); returns
// (name, dtype, shape) of every target tensor in the container's order. Every piece is
// verified, the target's header and fills included.
py::list DictsApply(const py::list& prev, const py::buffer& delta, const py::object& allocate,
                    int threads) {
  const HeldBuffers p = ReadTensors(prev);
  const py::buffer_info d = delta.request();
  py::list buffers;  // what allocate gave, alive until the apply is over
  std::unique_ptr<py::error_already_set> raised;  // allocate's exception, raised again below
  const arc_v3::TensorAllocator fresh = [&](const std::string& name, const std::string& dtype,
                                            const std::vector<uint64_t>& shape, uint64_t bytes,
                                            void** data) {
    py::gil_scoped_acquire gil;
    try {
      py::object buffer = allocate(name, dtype, shape);
      const py::buffer_info info = py::reinterpret_borrow<py::buffer>(buffer).request(true);
      if (static_cast<uint64_t>(info.size * info.itemsize) != bytes) {
        return arc_v3::Status(arc_v3::ErrorCode::kInternal,
                              "allocate('" + name + "') gave the wrong size");
      }
      buffers.append(buffer);
      *data = info.ptr;
      return arc_v3::Status::Ok();
    } catch (py::error_already_set& e) {
      raised = std::make_unique<py::error_already_set>(std::move(e));
      return arc_v3::Status(arc_v3::ErrorCode::kInternal, "allocate('" + name + "') raised");
    }
  };
  std::vector<arc_v3::NamedTensor> rebuilt;
  arc_v3::Status status;
  {
    py::gil_scoped_release release;
    status =
        arc_v3::StateDictApply(p.tensors, static_cast<const uint8_t*>(d.ptr),
                               static_cast<size_t>(d.size * d.itemsize), fresh, threads, &rebuilt);
  }
  if (raised) throw *raised;
  if (!status.ok()) throw CodecError{status};
  py::list out;
  for (const arc_v3::NamedTensor& t : rebuilt) out.append(py::make_tuple(t.name, t.dtype, t.shape));
  return out;
}

class PyPublisher {
 public:
  PyPublisher(const std::string& store, uint32_t shard, uint32_t count, uint64_t anchor_every,
              int effort, int threads, const std::string& file_name, int retries, int connections,
              const std::string& incarnation, const std::string& sign_key) {
    arc_v3::PublisherOptions o;
    o.shard = shard;
    o.count = count;
    o.anchor_every = anchor_every;
    o.effort = effort;
    o.threads = threads;
    o.file_name = file_name;
    o.incarnation = incarnation;
    o.sign_key = sign_key;
    o.store = Settings(retries, connections);
    const arc_v3::Status status = arc_v3::Publisher::Open(store, o, &publisher_);
    if (!status.ok()) throw CodecError{status};
  }
  py::dict Publish(uint64_t step, const py::list& tensors) {
    const HeldBuffers held = ReadTensors(tensors);
    arc_v3::PublishResult r;
    arc_v3::Status status;
    {
      py::gil_scoped_release release;
      status = publisher_->Publish(step, held.tensors, &r);
    }
    if (!status.ok()) throw CodecError{status};
    py::dict d;
    d["step"] = step;
    d["committed"] = r.committed;
    d["pending"] = r.pending;
    d["delta_bytes"] = r.delta_bytes;
    d["anchor_bytes"] = r.anchor_bytes;
    d["uploaded_bytes"] = r.uploaded_bytes;
    d["seconds"] =
        py::dict(py::arg("encode") = r.encode_seconds, py::arg("upload") = r.upload_seconds,
                 py::arg("commit") = r.commit_seconds, py::arg("total") = r.total_seconds);
    return d;
  }
  py::object last_step() const {
    const uint64_t s = publisher_->last_step();
    return s == arc_v3::kNoStep ? py::none() : py::object(py::int_(s));
  }
  uint64_t held_bytes() const { return publisher_->held_bytes(); }

 private:
  std::unique_ptr<arc_v3::Publisher> publisher_;
};

// A follower whose new tensors' memory comes from a Python callable:
// allocate(name, dtype, shape, row_begin, row_end) -> a writable C-contiguous buffer of
// exactly the rows' bytes (a tensor's numpy view). The object is kept while the follower
// holds the tensor.
// MirrorSteps / FollowMirror (arc_v3_sync.hpp): a report as a dict.
py::dict MirrorDict(const arc_v3::MirrorResult& r) {
  py::dict d;
  const auto step = [](uint64_t s) {
    return s == arc_v3::kNoStep ? py::object(py::none()) : py::object(py::int_(s));
  };
  d["from_step"] = step(r.from_step);
  d["step"] = step(r.to_step);
  d["up_to_date"] = r.up_to_date;
  d["steps_copied"] = r.steps;
  d["copied_objects"] = r.copied_objects;
  d["copied_bytes"] = r.copied_bytes;
  d["skipped_objects"] = r.skipped_objects;
  d["skipped_bytes"] = r.skipped_bytes;
  d["fetched_bytes"] = r.fetched_bytes;
  d["seconds"] = r.total_seconds;
  d["published_at"] = r.published_at;
  d["committed_at"] = r.committed_at;
  return d;
}

arc_v3::MirrorOptions MirrorOptionsOf(py::object step, const std::vector<std::string>& trusted_keys,
                                      const std::string& work_dir, int parallel, int retries,
                                      int connections) {
  arc_v3::MirrorOptions o;
  o.step = step.is_none() ? arc_v3::kLatestStep : step.cast<uint64_t>();
  o.trusted_keys = trusted_keys;
  o.work_dir = work_dir;
  o.parallel = parallel;
  o.store.retries = retries;
  o.store.connections = connections;
  return o;
}

py::dict Mirror(const std::string& src, const std::string& dst, py::object step,
                const std::vector<std::string>& trusted_keys, const std::string& work_dir,
                int parallel, int retries, int connections) {
  const arc_v3::MirrorOptions o =
      MirrorOptionsOf(step, trusted_keys, work_dir, parallel, retries, connections);
  arc_v3::MirrorResult r;
  arc_v3::Status status;
  {
    py::gil_scoped_release release;
    status = arc_v3::MirrorSteps(src, dst, o, &r);
  }
  if (!status.ok()) throw CodecError{status};
  return MirrorDict(r);
}

// Calls a follow loop's Python `on_event(kind, report, message, failures)` for `e` (kind
// "pulled", "waiting", "refused" or "retrying"); whether the loop goes on (None: it does).
bool TellEvent(const py::object& on_event, const arc_v3::FollowEvent& e, const py::object& report) {
  using Kind = arc_v3::FollowEvent::Kind;
  const char* kind = e.kind == Kind::kPulled    ? "pulled"
                     : e.kind == Kind::kWaiting ? "waiting"
                     : e.kind == Kind::kRefused ? "refused"
                                                : "retrying";
  const std::string message = e.kind == Kind::kRefused
                                  ? "step " + std::to_string(e.step) + " refused: " + e.message
                                  : e.message;
  const py::object keep = on_event(kind, report, message, e.failures);
  return keep.is_none() || py::bool_(keep).cast<bool>();
}

// FollowMirror. `on_event(kind, report, message, failures)` as Follower.follow's: kind
// "pulled" (report: as mirror's, with lag_seconds), "waiting", "retrying" or "refused"; a
// false return stops. A signal (Ctrl-C) ends the wait between polls with its exception.
void MirrorFollow(const std::string& src, const std::string& dst,
                  const std::vector<std::string>& trusted_keys, const std::string& work_dir,
                  int parallel, int retries, int connections, double interval, py::object until,
                  int max_failures, const std::string& events, py::object on_event) {
  const arc_v3::MirrorOptions o =
      MirrorOptionsOf(py::none(), trusted_keys, work_dir, parallel, retries, connections);
  arc_v3::FollowOptions f;
  f.interval_seconds = interval;
  f.until = until.is_none() ? arc_v3::kNoStep : until.cast<uint64_t>();
  f.max_failures = max_failures;
  f.events_listen = events;
  std::unique_ptr<py::error_already_set> error;
  f.stop_requested = [&error] {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return false;
    error = std::make_unique<py::error_already_set>();
    return true;
  };
  const auto note = [&](const arc_v3::FollowEvent& e, const arc_v3::MirrorResult* r) {
    py::gil_scoped_acquire gil;
    try {
      py::object report = py::none();
      if (r != nullptr) {
        py::dict d = MirrorDict(*r);
        d["lag_seconds"] = e.lag_seconds;
        report = d;
      }
      return TellEvent(on_event, e, report);
    } catch (py::error_already_set& err) {
      error = std::make_unique<py::error_already_set>(std::move(err));
      return false;
    }
  };
  arc_v3::Status status;
  {
    py::gil_scoped_release release;
    status = arc_v3::FollowMirror(src, dst, o, f, note);
  }
  if (error) throw std::move(*error);
  if (!status.ok()) throw CodecError{status};
}

class PyFollower {
 public:
  PyFollower(const std::string& store, const std::string& tensors, uint64_t row_begin,
             uint64_t row_end, int threads, int retries, int connections,
             const std::vector<std::string>& trusted_keys, py::object allocate)
      : allocate_(std::move(allocate)) {
    arc_v3::FollowerOptions o;
    o.trusted_keys = trusted_keys;
    o.tensors = tensors;
    o.row_begin = row_begin;
    o.row_end = row_end;
    o.threads = threads;
    o.store = Settings(retries, connections);
    arc_v3::Status status = arc_v3::Follower::Open(store, o, &follower_);
    if (!status.ok()) throw CodecError{status};
    follower_->set_allocator([this](const std::string& name, const std::string& dtype,
                                    const std::vector<uint64_t>& shape, uint64_t begin,
                                    uint64_t end, uint64_t bytes, void** data,
                                    std::shared_ptr<void>* owner) {
      py::gil_scoped_acquire acquire;
      try {
        py::object buffer = allocate_(name, dtype, shape, begin, end);
        const py::buffer_info info = py::reinterpret_borrow<py::buffer>(buffer).request(true);
        if (static_cast<uint64_t>(info.size * info.itemsize) != bytes) {
          return arc_v3::Status(arc_v3::ErrorCode::kInvalidArgument,
                                "allocate('" + name + "') gave " +
                                    std::to_string(info.size * info.itemsize) + " bytes, not " +
                                    std::to_string(bytes));
        }
        *data = info.ptr;
        *owner = std::shared_ptr<void>(new py::object(buffer), [](void* p) {
          py::gil_scoped_acquire gil;
          delete static_cast<py::object*>(p);
        });
        return arc_v3::Status::Ok();
      } catch (py::error_already_set& e) {
        return arc_v3::Status(arc_v3::ErrorCode::kInvalidArgument,
                              std::string("allocate failed: ") + e.what());
      }
    });
  }
  py::dict Pull(py::object step) {
    arc_v3::FollowResult r;
    arc_v3::Status status;
    const uint64_t target = step.is_none() ? arc_v3::kLatestStep : step.cast<uint64_t>();
    {
      py::gil_scoped_release release;
      status = follower_->Pull(target, &r);
    }
    if (!status.ok()) throw CodecError{status};
    return ResultDict(r);
  }
  // Follower::Follow. `on_event(kind, result, message, failures)`: kind "pulled" (result:
  // as pull's, with steps_behind and lag_seconds), "waiting", "retrying" or "refused" (a
  // step that failed verification under trust; result None);
  // a false return stops. A signal (Ctrl-C) ends the wait between polls with its exception.
  // `events`: FollowOptions::events_listen ("" for none).
  void Follow(double interval, py::object until, int max_failures, const std::string& events,
              py::object on_event) {
    arc_v3::FollowOptions o;
    o.interval_seconds = interval;
    o.events_listen = events;
    o.until = until.is_none() ? arc_v3::kNoStep : until.cast<uint64_t>();
    o.max_failures = max_failures;
    std::unique_ptr<py::error_already_set> error;
    o.stop_requested = [&error] {
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() == 0) return false;
      error = std::make_unique<py::error_already_set>();
      return true;
    };
    arc_v3::Status status;
    {
      py::gil_scoped_release release;
      status =
          follower_->Follow(o, [&](const arc_v3::FollowEvent& e, const arc_v3::FollowResult* r) {
            py::gil_scoped_acquire gil;
            try {
              py::object result = py::none();
              if (r != nullptr) {
                py::dict d = ResultDict(*r);
                d["steps_behind"] = e.steps_behind;
                d["lag_seconds"] = e.lag_seconds;
                result = d;
              }
              return TellEvent(on_event, e, result);
            } catch (py::error_already_set& err) {
              error = std::make_unique<py::error_already_set>(std::move(err));
              return false;
            }
          });
    }
    if (error) throw std::move(*error);
    if (!status.ok()) throw CodecError{status};
  }
  static py::dict ResultDict(const arc_v3::FollowResult& r) {
    py::dict d;
    d["step"] = r.step;
    d["from_step"] =
        r.from_step == arc_v3::kNoStep ? py::object(py::none()) : py::object(py::int_(r.from_step));
    d["up_to_date"] = r.up_to_date;
    d["route"] = r.route;
    d["rerouted"] = r.rerouted.empty() ? py::object(py::none()) : py::object(py::str(r.rerouted));
    d["steps"] = r.steps;
    d["fetched_bytes"] = r.fetched_bytes;
    d["requests"] = r.requests;
    d["changed_elements"] = r.changed_elements;
    d["undo_bytes"] = r.undo_bytes;
    d["published_at"] = r.published_at;
    d["committed_at"] = r.committed_at;
    d["seconds"] =
        py::dict(py::arg("fetch") = r.fetch_seconds, py::arg("decode") = r.decode_seconds,
                 py::arg("commit") = r.commit_seconds, py::arg("total") = r.total_seconds);
    return d;
  }
  py::object step() const {
    const uint64_t s = follower_->step();
    return s == arc_v3::kNoStep ? py::none() : py::object(py::int_(s));
  }
  // (name, dtype, shape, row_begin, row_end) of every selected tensor held, in shard and
  // file order.
  py::list tensors() const {
    py::list out;
    for (const arc_v3::FollowedTensor& t : follower_->tensors()) {
      if (t.selected) out.append(py::make_tuple(t.name, t.dtype, t.shape, t.row_begin, t.row_end));
    }
    return out;
  }

 private:
  py::object allocate_;
  std::unique_ptr<arc_v3::Follower> follower_;
};

}  // namespace

PYBIND11_MODULE(_arc_v3, m) {
  m.doc() = "Low-level binding of the arc_v3 codec; use the arc_v3 package instead.";

  // The exception class lives in Python (arc_v3/_errors.py) so that it pickles and
  // documents like any other; it is looked up once and kept for the process lifetime.
  static py::handle error_class =
      py::object(py::module_::import("arc_v3._errors").attr("ArcV3Error")).release();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CodecError& e) {
      const auto code = e.status.code();
      py::object exc =
          error_class(static_cast<int>(code), arc_v3::ErrorName(code), e.status.message());
      PyErr_SetObject(error_class.ptr(), exc.ptr());
    }
  });

  m.def("compress", &Compress, py::arg("src"), py::arg("dst"), py::arg("format"), py::arg("effort"),
        py::arg("threads"), py::arg("chunk_elements"));
  m.def("decompress_into", &DecompressInto, py::arg("src"), py::arg("payload"), py::arg("checksum"),
        py::arg("out"), py::arg("threads"));
  m.def("decompress_to_bytes", &DecompressToBytes, py::arg("src"), py::arg("payload"),
        py::arg("checksum"), py::arg("threads"));
  m.def("compress_tensors", &CompressTensors, py::arg("srcs"), py::arg("dsts"), py::arg("format"),
        py::arg("effort"), py::arg("threads"), py::arg("chunk_elements"));
  m.def("decompress_tensors_into", &DecompressTensorsInto, py::arg("srcs"), py::arg("payload"),
        py::arg("checksum"), py::arg("outs"), py::arg("threads"));
  m.def("inspect", &Inspect, py::arg("payload"));
  m.def("worth_grouping", &WorthGrouping, py::arg("src"), py::arg("dst"));
  py::class_<PySession>(m, "Session")
      .def(py::init<int, int, uint32_t>(), py::arg("effort"), py::arg("threads"),
           py::arg("chunk_elements"))
      .def("compress", &PySession::Compress, py::arg("src"), py::arg("dst"))
      .def("decompress_into", &PySession::DecompressInto, py::arg("src"), py::arg("payload"),
           py::arg("checksum"), py::arg("out"))
      .def("compress_tensors", &PySession::CompressTensors, py::arg("srcs"), py::arg("dsts"))
      .def("decompress_tensors_into", &PySession::DecompressTensorsInto, py::arg("srcs"),
           py::arg("payload"), py::arg("checksum"), py::arg("outs"))
      .def_property_readonly("steps", &PySession::steps)
      .def_property_readonly("history_id", &PySession::history_id)
      .def("reset", &PySession::Reset);
  m.def("xxh3_64", &Xxh3, py::arg("buffer"));
  m.def("container_manifest", &ContainerManifest, py::arg("container"));
  m.def("dicts_diff", &DictsDiff, py::arg("prev"), py::arg("next"), py::arg("format"),
        py::arg("effort"), py::arg("threads"));
  m.def("dicts_apply", &DictsApply, py::arg("prev"), py::arg("delta"), py::arg("allocate"),
        py::arg("threads"));
  m.def(
      "keygen",
      [](const std::string& path) {
        std::string id;
        const arc_v3::Status status = arc_v3::GenerateSigningKey(path, &id);
        if (!status.ok()) throw CodecError{status};
        return id;
      },
      py::arg("path"));
  m.def("mirror", &Mirror, py::arg("src"), py::arg("dst"), py::arg("step"), py::arg("trusted_keys"),
        py::arg("work_dir"), py::arg("parallel"), py::arg("retries"), py::arg("connections"));
  m.def("mirror_follow", &MirrorFollow, py::arg("src"), py::arg("dst"), py::arg("trusted_keys"),
        py::arg("work_dir"), py::arg("parallel"), py::arg("retries"), py::arg("connections"),
        py::arg("interval"), py::arg("until"), py::arg("max_failures"), py::arg("events"),
        py::arg("on_event"));
  py::class_<PyPublisher>(m, "Publisher")
      .def(py::init<const std::string&, uint32_t, uint32_t, uint64_t, int, int, const std::string&,
                    int, int, const std::string&, const std::string&>(),
           py::arg("store"), py::arg("shard"), py::arg("count"), py::arg("anchor_every"),
           py::arg("effort"), py::arg("threads"), py::arg("file_name"), py::arg("retries"),
           py::arg("connections"), py::arg("incarnation"), py::arg("sign_key"))
      .def("publish", &PyPublisher::Publish, py::arg("step"), py::arg("tensors"))
      .def_property_readonly("last_step", &PyPublisher::last_step)
      .def_property_readonly("held_bytes", &PyPublisher::held_bytes);
  py::class_<PyFollower>(m, "Follower")
      .def(py::init<const std::string&, const std::string&, uint64_t, uint64_t, int, int, int,
                    const std::vector<std::string>&, py::object>(),
           py::arg("store"), py::arg("tensors"), py::arg("row_begin"), py::arg("row_end"),
           py::arg("threads"), py::arg("retries"), py::arg("connections"), py::arg("trusted_keys"),
           py::arg("allocate"))
      .def("pull", &PyFollower::Pull, py::arg("step"))
      .def("follow", &PyFollower::Follow, py::arg("interval"), py::arg("until"),
           py::arg("max_failures"), py::arg("events"), py::arg("on_event"))
      .def_property_readonly("step", &PyFollower::step)
      .def("tensors", &PyFollower::tensors);
  m.def("_time_direct", &TimeDirect, py::arg("src"), py::arg("dst"), py::arg("format"),
        py::arg("threads"), py::arg("repeats"));

  // Codec constants, so that Python never hard-codes a number the C++ side owns.
  m.attr("FORMAT_DEFAULT") = static_cast<int>(arc_v3::Format::kDefault);
  m.attr("FORMAT_ARC_V3") = static_cast<int>(arc_v3::Format::kPublished);
  m.attr("CONTAINER_MAGIC") = py::bytes(arc_v3::kDeltaMagic, sizeof(arc_v3::kDeltaMagic));
  py::dict names;
  for (int c = 0; c < static_cast<int>(arc_v3::ErrorCode::kMaxCode); ++c) {
    names[py::int_(c)] = arc_v3::ErrorName(static_cast<arc_v3::ErrorCode>(c));
  }
  m.attr("ERROR_NAMES") = names;
  const arc_v3::Options defaults;
  m.attr("DEFAULT_EFFORT") = defaults.effort;
  m.attr("DEFAULT_CHUNK_ELEMENTS") = defaults.chunk_elements;
  m.attr("VERSION") = arc_v3::VersionString();
  m.attr("FORMAT_VERSION") = arc_v3::FormatVersion();
  m.attr("ACTIVE_TARGET") = arc_v3::ActiveTarget();
}
