// safetensors (https://github.com/huggingface/safetensors), the weights format that PyTorch and
// Hugging Face read: 8-byte little-endian header length N, N bytes of JSON
//   {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// (padded with spaces to a multiple of 8), then the raw little-endian data; offsets are relative
// to the end of the header. Hand-written: the format is this small, and Debian packages no C++
// implementation (only the Rust crate and its Python binding).
//
// Topology-independent checkpoints: every tensor may be one slice of a larger global tensor
// (e.g. this rank's columns of a tensor-parallel weight). Its global shape and the offset of the
// slice are stored in __metadata__["exatrain.slices"] (a JSON string), and assemble_global()
// rebuilds a global tensor from the slices in any set of files.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/fileio.hpp"

namespace exatrain::checkpoint {

enum class DType { F32, BF16 };
const char* dtype_name(DType);
size_t dtype_bytes(DType);

// float32 -> bfloat16 with round-to-nearest-even (NaN stays NaN), and back (exact).
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;         // of the stored slice
  std::vector<int64_t> global_shape;  // of the whole tensor (== shape when not a slice)
  std::vector<int64_t> offset;        // of the slice inside the global tensor
  uint64_t begin = 0, end = 0;        // byte range in the data section
  int64_t numel() const;
};

class SafetensorsWriter {
 public:
  // `data`: row-major float32, product(shape) elements, kept by pointer until write().
  void add(const std::string& name, const std::vector<int64_t>& shape, const float* data,
           DType stored = DType::F32);
  // A slice of a global tensor: `shape` at `offset` inside `global_shape`.
  void add_slice(const std::string& name, const std::vector<int64_t>& shape, const float* data,
                 DType stored, const std::vector<int64_t>& global_shape,
                 const std::vector<int64_t>& offset);
  // A whole float32 tensor declared without data, for a file whose data others write at the
  // offsets data_ranges() gives (e.g. every rank its slices: train/checkpoint_io.hpp).
  // header() and file_prefix() lay it out as add() would; write() refuses it.
  void declare(const std::string& name, const std::vector<int64_t>& shape);
  void set_metadata(const std::string& key, const std::string& value);
  // Streams header and data (converted to each tensor's stored dtype) into `out`.
  void write(OutputFile& out) const;
  std::string header() const;  // the JSON header, padded; tensors laid out in name order
  // What precedes the data in the file: the 8-byte header length, then header(). The data
  // section starts at file_prefix().size().
  std::string file_prefix() const;
  // Every tensor's [begin, end) in the data section (bytes from its start), as header() says.
  std::map<std::string, std::pair<uint64_t, uint64_t>> data_ranges() const;

 private:
  struct Entry {
    TensorInfo info;
    const float* data;
  };
  std::map<std::string, Entry> tensors_;  // sorted by name: the layout is deterministic
  std::set<std::string> declared_;        // tensors without data (declare())
  std::map<std::string, std::string> metadata_;
};

// Writes a safetensors file durably (fsync); returns its SHA-256.
std::string write_safetensors(const std::string& path, const SafetensorsWriter& writer);

class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);  // maps and validates the whole layout
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;
  const std::string& path() const { return file_->path(); }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  const TensorInfo& info(const std::string& name) const;  // error names the file and tensor
  // Checks the tensor exists with this shape (a checkpoint of another model fails here).
  void expect_shape(const std::string& name, const std::vector<int64_t>& shape) const;
  // The tensor as float32 (BF16 widened exactly); `count` must equal its element count.
  void read_f32(const std::string& name, float* out, int64_t count) const;
  std::vector<float> read_f32(const std::string& name) const;
  // Elements [first, first + count) of the tensor in row-major order, as float32. F32 data is
  // read with pread(2) straight into `out`, so reading a slice maps no page of the file (a rank
  // loading its shard holds only the shard).
  void read_f32_range(const std::string& name, int64_t first, int64_t count, float* out) const;

 private:
  std::unique_ptr<MappedFile> file_;  // the header, and BF16 data
  UniqueFd fd_;                       // F32 data (pread)
  uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The whole tensor `name`, assembled from its slices in `files` (each element covered exactly
// once: slices must lie inside the global shape and their sizes must add up to it).
std::vector<float> assemble_global(const std::vector<const SafetensorsReader*>& files,
                                   const std::string& name, std::vector<int64_t>* global_shape);

std::string shape_string(const std::vector<int64_t>& shape);  // "[2, 3]"

// How many of data[0, n) are NaN or +-Inf; *first gets the index of the first (-1 when none).
int64_t count_nonfinite(const float* data, int64_t n, int64_t* first);

// The tensors of `file` that hold NaN or Inf values, one line each ("  NAME: K of N values are
// NaN or Inf (first at element I)"), at most `max_lines`; "" when every value is finite. Reads
// one tensor at a time. `sample` and `export` refuse such weights.
std::string nonfinite_tensors(const SafetensorsReader& file, int max_lines = 5);

}  // namespace exatrain::checkpoint
