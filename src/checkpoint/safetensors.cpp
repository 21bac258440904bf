#include "checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/check.hpp"
#include "core/checked.hpp"
#include "core/json_fields.hpp"

namespace exatrain::checkpoint {

using nlohmann::json;

namespace {
constexpr const char* kSlicesKey = "exatrain.slices";
constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference reader's limit too

int64_t product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
}  // namespace

const char* dtype_name(DType d) { return d == DType::F32 ? "F32" : "BF16"; }
size_t dtype_bytes(DType d) { return d == DType::F32 ? 4 : 2; }

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit, then truncate.
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t TensorInfo::numel() const { return product(shape); }

void SafetensorsWriter::add(const std::string& name, const std::vector<int64_t>& shape,
                            const float* data, DType stored) {
  add_slice(name, shape, data, stored, shape, std::vector<int64_t>(shape.size(), 0));
}

void SafetensorsWriter::add_slice(const std::string& name, const std::vector<int64_t>& shape,
                                  const float* data, DType stored,
                                  const std::vector<int64_t>& global_shape,
                                  const std::vector<int64_t>& offset) {
  EXA_CHECK(!name.empty() && name != "__metadata__", "safetensors: bad tensor name \"{}\"", name);
  EXA_CHECK(tensors_.count(name) == 0, "safetensors: tensor \"{}\" added twice", name);
  EXA_CHECK(shape.size() == global_shape.size() && shape.size() == offset.size(),
            "tensor {}: shape {}, global shape {} and offset {} differ in rank", name,
            shape_string(shape), shape_string(global_shape), shape_string(offset));
  for (size_t d = 0; d < shape.size(); d++) {
    EXA_CHECK(shape[d] >= 0 && offset[d] >= 0 && offset[d] + shape[d] <= global_shape[d],
              "tensor {}: slice {} at offset {} does not fit in global shape {}", name,
              shape_string(shape), shape_string(offset), shape_string(global_shape));
  }
  EXA_CHECK(data != nullptr || product(shape) == 0, "tensor {}: null data", name);
  Entry e{{name, stored, shape, global_shape, offset, 0, 0}, data};
  tensors_[name] = e;
}

void SafetensorsWriter::declare(const std::string& name, const std::vector<int64_t>& shape) {
  const std::vector<int64_t> zero(shape.size(), 0);
  static const float kNone = 0;  // add_slice wants data; write() checks declared_ instead
  add_slice(name, shape, &kNone, DType::F32, shape, zero);
  declared_.insert(name);
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  EXA_CHECK(key != kSlicesKey, "safetensors: metadata key {} is reserved", key);
  metadata_[key] = value;
}

std::map<std::string, std::pair<uint64_t, uint64_t>> SafetensorsWriter::data_ranges() const {
  std::map<std::string, std::pair<uint64_t, uint64_t>> out;
  uint64_t offset = 0;
  for (const auto& [name, e] : tensors_) {
    const uint64_t bytes = uint64_t(product(e.info.shape)) * dtype_bytes(e.info.dtype);
    out[name] = {offset, offset + bytes};
    offset += bytes;
  }
  return out;
}

std::string SafetensorsWriter::header() const {
  json h = json::object();
  json slices = json::object();
  const auto ranges = data_ranges();
  for (const auto& [name, e] : tensors_) {
    const auto& [begin, end] = ranges.at(name);
    h[name] = {{"dtype", dtype_name(e.info.dtype)},
               {"shape", e.info.shape},
               {"data_offsets", {begin, end}}};
    slices[name] = {{"global_shape", e.info.global_shape}, {"offset", e.info.offset}};
  }
  json meta = json::object();
  for (const auto& [k, v] : metadata_) meta[k] = v;
  meta[kSlicesKey] = slices.dump();
  h["__metadata__"] = meta;
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data then starts 8-byte aligned
  return text;
}

std::string SafetensorsWriter::file_prefix() const {
  const std::string text = header();
  const uint64_t n = text.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; i++) out[size_t(i)] = char(uint8_t(n >> (8 * i)));  // little-endian
  return out + text;
}

void SafetensorsWriter::write(OutputFile& out) const {
  const std::string prefix = file_prefix();
  out.write(prefix.data(), prefix.size());
  std::vector<uint16_t> staging;
  for (const auto& [name, e] : tensors_) {
    EXA_CHECK(declared_.count(name) == 0, "safetensors: tensor \"{}\" was declared without data; "
              "its writer must place it at its data_ranges() offset", name);
    const int64_t count = product(e.info.shape);
    if (e.info.dtype == DType::F32) {
      out.write(e.data, size_t(count) * 4);
      continue;
    }
    const int64_t kChunk = 1 << 16;  // convert in chunks: no full-size copy of big tensors
    staging.resize(size_t(std::min(count, kChunk)));
    for (int64_t start = 0; start < count; start += kChunk) {
      int64_t m = std::min(kChunk, count - start);
      for (int64_t i = 0; i < m; i++) staging[size_t(i)] = float_to_bf16(e.data[start + i]);
      out.write(staging.data(), size_t(m) * 2);
    }
  }
}

std::string write_safetensors(const std::string& path, const SafetensorsWriter& writer) {
  OutputFile out(path);
  writer.write(out);
  out.sync_and_close();
  return out.sha256_of_appended();
}

SafetensorsReader::~SafetensorsReader() = default;

namespace {
// A JSON array of non-negative integers (a shape or an offset), each checked as an integer.
std::vector<int64_t> dims_of(const json& v, const std::string& what) {
  EXA_CHECK(v.is_array() && v.size() <= 64, "{} = {}: expected an array of at most 64 integers >= 0", what,
            json_shown(v));
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); i++) out.push_back(json_to_int(v[i], fmt::format("{}[{}]", what, i), 0, INT64_MAX));
  return out;
}

// One tensor's header entry, checked: dtype, shape (element and byte counts fit), offsets.
TensorInfo tensor_of(const std::string& path, const std::string& name, const json& t) {
  const std::string where = fmt::format("safetensors file {}: tensor \"{}\"", path, name);
  TensorInfo info;
  info.name = name;
  std::string dt = json_to_string(json_member(t, "dtype", where), where + " dtype");
  EXA_CHECK(dt == "F32" || dt == "BF16", "safetensors file {}: tensor {} has dtype {}, expected F32 or BF16", path,
            name, dt);
  info.dtype = dt == "F32" ? DType::F32 : DType::BF16;
  info.shape = dims_of(json_member(t, "shape", where), where + " shape");
  // The byte count must fit too: the data_offsets check below compares against it.
  const auto numel = checked_numel(info.shape, INT64_MAX / int64_t(dtype_bytes(info.dtype)));
  EXA_CHECK(numel.has_value(), "{}: shape {} has more elements than can be counted (or stored)", where,
            shape_string(info.shape));
  const json& offsets = json_member(t, "data_offsets", where);
  EXA_CHECK(offsets.is_array() && offsets.size() == 2, "{}: data_offsets = {}: expected [begin, end]", where,
            json_shown(offsets));
  info.begin = json_to_uint(offsets[0], where + " data_offsets[0]");
  info.end = json_to_uint(offsets[1], where + " data_offsets[1]");
  info.global_shape = info.shape;
  info.offset.assign(info.shape.size(), 0);
  return info;
}

// Applies a tensor's exatrain.slices entry: its global shape and offset, checked against its
// shape (same rank, offset + shape <= global shape in every dimension, a countable global shape).
void apply_slice(const std::string& path, TensorInfo& info, const json& entry) {
  const std::string where = fmt::format("safetensors file {}: exatrain.slices of tensor \"{}\"", path, info.name);
  std::vector<int64_t> g = dims_of(json_member(entry, "global_shape", where), where + " global_shape");
  std::vector<int64_t> off = dims_of(json_member(entry, "offset", where), where + " offset");
  EXA_CHECK(g.size() == info.shape.size() && off.size() == info.shape.size(),
            "{}: global shape {} and offset {} must have the rank of the tensor's shape {}", where, shape_string(g),
            shape_string(off), shape_string(info.shape));
  for (size_t d = 0; d < g.size(); d++) {
    auto last = add_i64(off[d], info.shape[d]);
    EXA_CHECK(last && *last <= g[d], "{}: the slice of shape {} at offset {} does not fit in the global shape {} "
              "(dimension {}: {} + {} > {})", where, shape_string(info.shape), shape_string(off), shape_string(g), d,
              off[d], info.shape[d], g[d]);
  }
  EXA_CHECK(checked_numel(g).has_value(), "{}: global shape {} has more elements than can be counted", where,
            shape_string(g));
  info.global_shape = std::move(g);
  info.offset = std::move(off);
}
}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path)
    : file_(std::make_unique<MappedFile>(path)) {  // a regular file: never a FIFO or device
  fd_ = UniqueFd(open_regular_file(path));
  const uint64_t size = file_->size();
  EXA_CHECK(size >= 8, "safetensors file {} is truncated: {} bytes, less than the 8-byte header "
            "length", path, size);
  uint64_t n = 0;
  for (int i = 0; i < 8; i++) n |= uint64_t(file_->data()[i]) << (8 * i);
  EXA_CHECK(n <= kMaxHeaderBytes, "safetensors file {}: header length {} is implausible (corrupt "
            "file?)", path, n);
  EXA_CHECK(8 + n <= size, "safetensors file {} is truncated: the header needs {} bytes, the file "
            "has {}", path, 8 + n, size);
  data_start_ = 8 + n;
  json h;
  try {
    h = json::parse(file_->data() + 8, file_->data() + 8 + n);
  } catch (const json::exception& e) {
    EXA_FAIL("safetensors file {}: header is not valid JSON ({}); corrupt file?", path, e.what());
  }
  EXA_CHECK(h.is_object(), "safetensors file {}: header is not a JSON object", path);
  json slices = json::object();
  try {
    if (h.contains("__metadata__")) {
      EXA_CHECK(h["__metadata__"].is_object(), "safetensors file {}: __metadata__ is not a JSON object", path);
      for (const auto& [k, v] : h["__metadata__"].items())
        metadata_[k] = json_to_string(v, fmt::format("safetensors file {}: __metadata__ \"{}\"", path, k));
      if (metadata_.count(kSlicesKey)) slices = json::parse(metadata_[kSlicesKey]);
      EXA_CHECK(slices.is_object(), "safetensors file {}: {} is not a JSON object", path, kSlicesKey);
    }
    for (const auto& [name, t] : h.items()) {
      if (name == "__metadata__") continue;
      tensors_[name] = tensor_of(path, name, t);
    }
    for (const auto& [name, entry] : slices.items()) {
      auto it = tensors_.find(name);
      EXA_CHECK(it != tensors_.end(), "safetensors file {}: {} describes tensor \"{}\", which the file does not hold",
                path, kSlicesKey, name);
      apply_slice(path, it->second, entry);
    }
  } catch (const json::exception& e) {
    EXA_FAIL("safetensors file {}: malformed header: {}", path, e.what());
  }
  // The data section must be covered exactly, in order, as the reference reader demands.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& [name, t] : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  uint64_t expected_begin = 0;
  for (const TensorInfo* t : by_offset) {
    const uint64_t bytes = uint64_t(t->numel()) * dtype_bytes(t->dtype);  // fits: checked in tensor_of
    const auto expected_end = add_u64(expected_begin, bytes);
    EXA_CHECK(expected_end && t->begin == expected_begin && t->end == *expected_end,
              "safetensors file {}: tensor {} (shape {}, {}) has data_offsets [{}, {}], expected "
              "[{}, {}]", path, t->name, shape_string(t->shape), dtype_name(t->dtype), t->begin,
              t->end, expected_begin, expected_end ? fmt::format("{}", *expected_end) : "overflow");
    expected_begin = t->end;
  }
  const auto described = add_u64(data_start_, expected_begin);
  EXA_CHECK(described && *described == size,
            "safetensors file {} is truncated or has trailing bytes: {} bytes, the header "
            "describes {}", path, size, described ? fmt::format("{}", *described) : "more than 2^64");
}

const TensorInfo& SafetensorsReader::info(const std::string& name) const {
  auto it = tensors_.find(name);
  EXA_CHECK(it != tensors_.end(), "safetensors file {} has no tensor \"{}\"", path(), name);
  return it->second;
}

void SafetensorsReader::expect_shape(const std::string& name,
                                     const std::vector<int64_t>& shape) const {
  EXA_CHECK(has(name), "checkpoint file {} has no tensor \"{}\" (a checkpoint of a different "
            "model?)", path(), name);
  const TensorInfo& t = info(name);
  EXA_CHECK(t.global_shape == shape,
            "checkpoint file {}: tensor \"{}\" has shape {}, expected {} (a checkpoint of a "
            "different model?)", path(), name, shape_string(t.global_shape), shape_string(shape));
}

void SafetensorsReader::read_f32(const std::string& name, float* out, int64_t count) const {
  const TensorInfo& t = info(name);
  EXA_CHECK(count == t.numel(), "safetensors file {}: tensor {} has {} elements, caller expects {}",
            path(), name, t.numel(), count);
  read_f32_range(name, 0, count, out);
}

void SafetensorsReader::read_f32_range(const std::string& name, int64_t first, int64_t count,
                                       float* out) const {
  const TensorInfo& t = info(name);
  EXA_CHECK(first >= 0 && count >= 0 && first <= t.numel() && count <= t.numel() - first,
            "safetensors file {}: elements [{}, {}) of tensor {} are outside its {} elements", path(),
            first, first + count, name, t.numel());
  const size_t bytes = dtype_bytes(t.dtype);
  uint64_t at = data_start_ + t.begin + uint64_t(first) * bytes;
  if (t.dtype == DType::F32) {
    char* dst = reinterpret_cast<char*>(out);
    for (size_t left = size_t(count) * 4; left > 0;) {
      const ssize_t n = ::pread(fd_.get(), dst, std::min(left, size_t(1) << 30), off_t(at));
      if (n < 0 && errno == EINTR) continue;
      EXA_SYSCHECK(n >= 0, "cannot read {} (tensor {}) at byte {}", path(), name, at);
      EXA_CHECK(n > 0, "safetensors file {}: ends at byte {}, inside tensor {}", path(), at, name);
      dst += n, left -= size_t(n), at += uint64_t(n);
    }
    return;
  }
  const uint8_t* src = file_->data() + at;
  for (int64_t i = 0; i < count; i++) {
    uint16_t b;
    std::memcpy(&b, src + 2 * i, 2);
    out[i] = bf16_to_float(b);
  }
}

std::vector<float> SafetensorsReader::read_f32(const std::string& name) const {
  std::vector<float> v(size_t(info(name).numel()));
  read_f32(name, v.data(), int64_t(v.size()));
  return v;
}

std::vector<float> assemble_global(const std::vector<const SafetensorsReader*>& files,
                                   const std::string& name, std::vector<int64_t>* global_shape) {
  std::vector<int64_t> g;
  bool found = false;
  for (const auto* f : files) {
    if (!f->has(name)) continue;
    const TensorInfo& t = f->info(name);
    EXA_CHECK(!found || t.global_shape == g, "tensor {}: global shape {} in {} but {} elsewhere",
              name, shape_string(t.global_shape), f->path(), shape_string(g));
    g = t.global_shape;
    found = true;
  }
  EXA_CHECK(found, "no checkpoint file holds tensor \"{}\"", name);
  const int64_t total = product(g);  // countable: the reader checked every global shape
  // The slices must add up to the global tensor before anything is allocated for it: a header
  // may claim any global shape, but its slices' data is in the files (which bounds the total).
  int64_t held = 0;
  for (const auto* f : files)
    if (f->has(name)) {
      auto sum = add_i64(held, f->info(name).numel());
      EXA_CHECK(sum.has_value(), "tensor {}: the slices' element counts overflow", name);
      held = *sum;
    }
  EXA_CHECK(held <= total, "tensor {}: slices overlap: they hold {} elements, but the global shape {} has {}", name,
            held, shape_string(g), total);
  EXA_CHECK(held == total, "tensor {}: the slices leave {} of {} elements of shape {} uncovered", name, total - held,
            total, shape_string(g));
  const size_t rank = g.size();
  std::vector<float> out(static_cast<size_t>(total));
  std::vector<uint8_t> covered(static_cast<size_t>(total), 0);
  std::vector<int64_t> stride(rank, 1);  // row-major strides of the global tensor
  for (size_t d = rank; d-- > 1;) stride[d - 1] = stride[d] * g[d];
  for (const auto* f : files) {
    if (!f->has(name)) continue;
    const TensorInfo& t = f->info(name);
    std::vector<float> part = f->read_f32(name);
    // Walk the slice in row-major order; idx is the multi-index inside the slice.
    std::vector<int64_t> idx(rank, 0);
    for (int64_t i = 0; i < t.numel(); i++) {
      int64_t dst = 0;
      for (size_t d = 0; d < rank; d++) dst += (t.offset[d] + idx[d]) * stride[d];
      EXA_CHECK(!covered[size_t(dst)], "tensor {}: slices overlap (in {})", name, f->path());
      covered[size_t(dst)] = 1;
      out[size_t(dst)] = part[size_t(i)];
      for (size_t d = rank; d-- > 0;) {  // increment the multi-index
        if (++idx[d] < t.shape[d]) break;
        idx[d] = 0;
      }
    }
  }
  int64_t missing = 0;
  for (uint8_t c : covered) missing += c ? 0 : 1;
  EXA_CHECK(missing == 0, "tensor {}: the slices leave {} of {} elements of shape {} uncovered",
            name, missing, total, shape_string(g));
  if (global_shape) *global_shape = g;
  return out;
}

int64_t count_nonfinite(const float* data, int64_t n, int64_t* first) {
  int64_t count = 0;
  if (first) *first = -1;
  for (int64_t i = 0; i < n; i++)
    if (!std::isfinite(data[i])) {
      if (count++ == 0 && first) *first = i;
    }
  return count;
}

std::string nonfinite_tensors(const SafetensorsReader& file, int max_lines) {
  std::string out;
  int lines = 0;
  for (const auto& [name, info] : file.tensors()) {
    const std::vector<float> v = file.read_f32(name);
    int64_t first = -1;
    const int64_t n = count_nonfinite(v.data(), int64_t(v.size()), &first);
    if (n > 0 && lines++ < max_lines)
      out += fmt::format("\n  {}: {} of {} values are NaN or Inf (first at element {})", name, n, v.size(), first);
  }
  return out;
}

}  // namespace exatrain::checkpoint
