#include "core/io/safetensors.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/io/crc32c.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

// Succeeds if the message of `status` contains every one of `parts`.
::testing::AssertionResult MessageContains(const absl::Status& status, const std::vector<std::string>& parts) {
  for (const std::string& part : parts) {
    if (status.message().find(part) == absl::string_view::npos) {
      return ::testing::AssertionFailure() << "message \"" << status.message() << "\" lacks \"" << part << "\"";
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename T>
absl::Span<const uint8_t> Bytes(const std::vector<T>& v) {
  return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T));
}

std::string LittleEndian64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
  return s;
}

// A file image: the 8-byte length of `header`, `header`, then `data`.
std::string FileImage(const std::string& header, const std::string& data) {
  return LittleEndian64(header.size()) + header + data;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/safetensors_test_XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  std::string WriteRaw(const std::string& name, const std::string& bytes) {
    const std::string path = Path(name);
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out.good()) << path;
    return path;
  }

  static std::string ReadRaw(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  // Opens a file holding `bytes`; expects InvalidArgument and returns it.
  absl::Status OpenCorrupt(const std::string& bytes) {
    const std::string path = WriteRaw("corrupt.safetensors", bytes);
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader = SafetensorsReader::Open(path);
    EXPECT_FALSE(reader.ok()) << "accepted a corrupt file";
    if (reader.ok()) return absl::OkStatus();
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument) << reader.status();
    EXPECT_TRUE(MessageContains(reader.status(), {path}));
    return reader.status();
  }

  std::string dir_;
};

// ------------------------------------------------------------------ writer

TEST_F(SafetensorsTest, ExactBytesOfATinyFile) {
  const std::vector<float> a = {1.0f, -2.0f};
  const std::vector<uint8_t> b = {1, 2, 3};
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.AddTensor("a", {2}, absl::MakeConstSpan(a)).ok());
  ASSERT_TRUE(writer.AddTensor("b", {3}, absl::MakeConstSpan(b)).ok());
  ASSERT_TRUE(writer.SetMetadata("step", "7").ok());
  const std::string path = Path("tiny.safetensors");
  absl::StatusOr<SafetensorsFileInfo> info = writer.Write(path);
  ASSERT_TRUE(info.ok()) << info.status();

  // 135 bytes of JSON plus one space makes the data start at 8 + 136 = 144.
  const std::string json =
      R"({"__metadata__":{"step":"7"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}})";
  ASSERT_EQ(json.size(), 135u);
  const std::string expected = std::string("\x88\0\0\0\0\0\0\0", 8) + json + " " +
                               std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0\x01\x02\x03", 11);
  const std::string actual = ReadRaw(path);
  EXPECT_EQ(actual, expected);
  EXPECT_EQ(info->size, 155u);
  EXPECT_EQ(info->crc32c, 0x17f866bau);  // of `expected`, computed independently in Python
  EXPECT_EQ(info->crc32c, Crc32c(actual.data(), actual.size()));
}

TEST_F(SafetensorsTest, HeaderIsPaddedWithSpacesToEightBytes) {
  const std::vector<double> v = {3.5};
  for (int len = 1; len <= 16; ++len) {
    SafetensorsWriter writer;
    ASSERT_TRUE(writer.AddTensor(std::string(len, 'x'), {1}, absl::MakeConstSpan(v)).ok());
    const std::string path = Path("pad.safetensors");
    ASSERT_TRUE(writer.Write(path).ok());
    const std::string file = ReadRaw(path);
    uint64_t n = 0;
    std::memcpy(&n, file.data(), 8);
    EXPECT_EQ((8 + n) % 8, 0u) << len;
    const std::string header = file.substr(8, n);
    const size_t close = header.rfind('}');
    ASSERT_NE(close, std::string::npos);
    EXPECT_LT(n - 1 - close, 8u);
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << header;
    // The F64 at the start of the data region is aligned, so GetAs works.
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader = SafetensorsReader::Open(path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    absl::StatusOr<absl::Span<const double>> got = (*reader)->GetAs<double>(std::string(len, 'x'));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)[0], 3.5);
  }
}

TEST_F(SafetensorsTest, RoundTripsEveryDtypeShapeAndMetadata) {
  const std::vector<double> f64 = {1.25, -0.5, 1e300, std::nan("")};
  const std::vector<int64_t> i64 = {INT64_MIN, -1, 0, INT64_MAX};
  const std::vector<uint64_t> u64 = {UINT64_MAX, 0};
  const std::vector<float> f32 = {0.f, 1.f, 2.f, 3.f, 4.f, 5.f};
  const std::vector<int32_t> i32 = {-7};
  const std::vector<uint32_t> u32 = {0xdeadbeef, 1};
  const std::vector<float> empty;
  const std::vector<uint8_t> u8 = {9, 8, 7};
  const std::vector<uint8_t> bf16 = {0x80, 0x3f, 0x00, 0xc0};  // 1.0, -2.0

  SafetensorsWriter writer;
  ASSERT_TRUE(writer.AddTensor("f64", {2, 2}, absl::MakeConstSpan(f64)).ok());
  ASSERT_TRUE(writer.AddTensor("i64", {4}, absl::MakeConstSpan(i64)).ok());
  ASSERT_TRUE(writer.AddTensor("layer/u64", {1, 2}, absl::MakeConstSpan(u64)).ok());
  ASSERT_TRUE(writer.AddTensor("f32", {2, 3}, absl::MakeConstSpan(f32)).ok());
  ASSERT_TRUE(writer.AddTensor("scalar_i32", {}, absl::MakeConstSpan(i32)).ok());
  ASSERT_TRUE(writer.AddTensor("u32", {2}, absl::MakeConstSpan(u32)).ok());
  ASSERT_TRUE(writer.AddTensor("empty", {0, 5}, absl::MakeConstSpan(empty)).ok());
  ASSERT_TRUE(writer.AddTensor("bf16", SafetensorsDtype::kBF16, {2}, absl::MakeConstSpan(bf16)).ok());
  ASSERT_TRUE(writer.AddTensor("u8 \xc3\xa9", {3}, absl::MakeConstSpan(u8)).ok());  // UTF-8 name
  ASSERT_TRUE(writer.SetMetadata("format", "shardwild").ok());
  ASSERT_TRUE(writer.SetMetadata("step", "1").ok());
  ASSERT_TRUE(writer.SetMetadata("step", "1200").ok());  // replaces
  EXPECT_EQ(writer.num_tensors(), 9u);

  const std::string path = Path("all.safetensors");
  absl::StatusOr<SafetensorsFileInfo> info = writer.Write(path, {.fsync = true});
  ASSERT_TRUE(info.ok()) << info.status();
  const std::string file = ReadRaw(path);
  EXPECT_EQ(info->size, file.size());
  EXPECT_EQ(info->crc32c, Crc32c(file.data(), file.size()));

  absl::StatusOr<std::unique_ptr<SafetensorsReader>> opened = SafetensorsReader::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  const SafetensorsReader& reader = **opened;
  EXPECT_EQ(reader.path(), path);
  EXPECT_EQ(reader.file_size(), file.size());
  EXPECT_EQ(reader.names(), (std::vector<std::string>{"f64", "i64", "layer/u64", "f32", "scalar_i32", "u32",
                                                      "empty", "bf16", "u8 \xc3\xa9"}));
  EXPECT_EQ(reader.metadata(), (std::map<std::string, std::string>{{"format", "shardwild"}, {"step", "1200"}}));

  auto check = [&](const std::string& name, SafetensorsDtype dtype, std::vector<int64_t> shape,
                   absl::Span<const uint8_t> bytes) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(reader.Contains(name));
    absl::StatusOr<SafetensorsTensor> t = reader.Get(name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->name, name);
    EXPECT_EQ(t->dtype, dtype);
    EXPECT_EQ(std::vector<int64_t>(t->shape.begin(), t->shape.end()), shape);
    EXPECT_EQ(std::vector<uint8_t>(t->data.begin(), t->data.end()), std::vector<uint8_t>(bytes.begin(), bytes.end()));
  };
  check("f64", SafetensorsDtype::kF64, {2, 2}, Bytes(f64));
  check("i64", SafetensorsDtype::kI64, {4}, Bytes(i64));
  check("layer/u64", SafetensorsDtype::kU64, {1, 2}, Bytes(u64));
  check("f32", SafetensorsDtype::kF32, {2, 3}, Bytes(f32));
  check("scalar_i32", SafetensorsDtype::kI32, {}, Bytes(i32));
  check("u32", SafetensorsDtype::kU32, {2}, Bytes(u32));
  check("empty", SafetensorsDtype::kF32, {0, 5}, Bytes(empty));
  check("bf16", SafetensorsDtype::kBF16, {2}, Bytes(bf16));
  check("u8 \xc3\xa9", SafetensorsDtype::kU8, {3}, Bytes(u8));
  EXPECT_EQ(reader.Get("scalar_i32")->num_elements(), 1);
  EXPECT_EQ(reader.Get("empty")->num_elements(), 0);

  // Typed access: f64, i64, u64 come first, so they and f32 are aligned.
  absl::StatusOr<absl::Span<const float>> f32_span = reader.GetAs<float>("f32");
  ASSERT_TRUE(f32_span.ok()) << f32_span.status();
  EXPECT_EQ(std::vector<float>(f32_span->begin(), f32_span->end()), f32);
  absl::StatusOr<absl::Span<const int64_t>> i64_span = reader.GetAs<int64_t>("i64");
  ASSERT_TRUE(i64_span.ok()) << i64_span.status();
  EXPECT_EQ(std::vector<int64_t>(i64_span->begin(), i64_span->end()), i64);
  EXPECT_TRUE(reader.GetAs<float>("empty").ok());
  EXPECT_TRUE(std::isnan(reader.GetAs<double>("f64").value()[3]));

  // Errors name the file and the tensor.
  absl::StatusOr<SafetensorsTensor> missing = reader.Get("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MessageContains(missing.status(), {path, "'nope'"}));
  EXPECT_FALSE(reader.Contains("nope"));
  absl::StatusOr<absl::Span<const double>> wrong = reader.GetAs<double>("f32");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(wrong.status(), {path, "'f32'", "F32", "not F64"}));
  EXPECT_EQ(reader.GetAs<float>("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, GetAsRejectsMisalignedData) {
  const std::vector<uint8_t> one = {1};
  const std::vector<double> d = {2.0};
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.AddTensor("byte", {1}, absl::MakeConstSpan(one)).ok());
  ASSERT_TRUE(writer.AddTensor("d", {1}, absl::MakeConstSpan(d)).ok());
  const std::string path = Path("misaligned.safetensors");
  ASSERT_TRUE(writer.Write(path).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<absl::Span<const double>> got = (*reader)->GetAs<double>("d");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(got.status(), {path, "'d'", "aligned"}));
  // The bytes are still there.
  absl::StatusOr<SafetensorsTensor> t = (*reader)->Get("d");
  ASSERT_TRUE(t.ok());
  double value;
  std::memcpy(&value, t->data.data(), sizeof(value));
  EXPECT_EQ(value, 2.0);
}

TEST_F(SafetensorsTest, EmptyWriterWritesAValidFile) {
  SafetensorsWriter writer;
  const std::string path = Path("empty.safetensors");
  absl::StatusOr<SafetensorsFileInfo> info = writer.Write(path);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(ReadRaw(path), FileImage("{}      ", ""));
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->names().empty());
  EXPECT_TRUE((*reader)->metadata().empty());
}

TEST_F(SafetensorsTest, AddTensorRejectsBadInput) {
  const std::vector<float> two = {1, 2};
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.AddTensor("w", {2}, absl::MakeConstSpan(two)).ok());
  struct Case {
    std::string name;
    std::vector<int64_t> shape;
    std::string expect;
  };
  for (const Case& c : std::vector<Case>{
           {"", {2}, "empty"},
           {"w", {2}, "'w' was already added"},
           {"__metadata__", {2}, "reserved"},
           {"bad\xff", {2}, "UTF-8"},
           {"neg", {-2}, "negative dimension"},
           {"size", {3}, "needs 12 bytes, got 8"},
           {"huge", {int64_t{1} << 62, 16}, "overflows"},
       }) {
    absl::Status s = writer.AddTensor(c.name, c.shape, absl::MakeConstSpan(two));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_TRUE(MessageContains(s, {c.expect})) << c.name;
  }
  EXPECT_FALSE(writer.AddTensor("p", SafetensorsDtype::kF32, {1}, SafetensorsWriter::Producer()).ok());
  EXPECT_FALSE(writer.SetMetadata("k", "\xc3").ok());
  EXPECT_EQ(writer.num_tensors(), 1u);  // nothing was added by the failures
}

TEST_F(SafetensorsTest, StreamsABigTensorThroughAProducer) {
  // 40 MiB of F32, produced in odd-sized pieces, never held in one buffer.
  constexpr int64_t kRows = 10 * 1024, kCols = 1024;
  constexpr size_t kBytes = kRows * kCols * sizeof(float);
  auto value = [](uint64_t i) { return static_cast<float>(i % 1000003) * 0.5f; };
  int calls = 0;
  SafetensorsWriter writer;
  const std::vector<uint64_t> head = {42};
  ASSERT_TRUE(writer.AddTensor("head", {1}, absl::MakeConstSpan(head)).ok());
  ASSERT_TRUE(writer
                  .AddTensor("big", SafetensorsDtype::kF32, {kRows, kCols},
                             [&](const SafetensorsWriter::Sink& sink) -> absl::Status {
                               ++calls;
                               std::vector<uint8_t> piece;
                               size_t sent = 0;
                               while (sent < kBytes) {
                                 // Pieces of 1 MiB + 3 bytes split elements across calls.
                                 const size_t n = std::min<size_t>((1 << 20) + 3, kBytes - sent);
                                 piece.resize(n);
                                 for (size_t b = 0; b < n; ++b) {
                                   const uint64_t byte = sent + b;
                                   const float f = value(byte / 4);
                                   uint8_t raw[4];
                                   std::memcpy(raw, &f, 4);
                                   piece[b] = raw[byte % 4];
                                 }
                                 absl::Status s = sink(absl::MakeConstSpan(piece));
                                 if (!s.ok()) return s;
                                 sent += n;
                               }
                               return absl::OkStatus();
                             })
                  .ok());
  const std::string path = Path("big.safetensors");
  absl::StatusOr<SafetensorsFileInfo> info = writer.Write(path);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(calls, 1);

  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->file_size(), info->size);
  absl::StatusOr<absl::Span<const float>> big = (*reader)->GetAs<float>("big");
  ASSERT_TRUE(big.ok()) << big.status();
  ASSERT_EQ(big->size(), static_cast<size_t>(kRows * kCols));
  for (size_t i = 0; i < big->size(); ++i) {
    if ((*big)[i] != value(i)) FAIL() << "element " << i << " is " << (*big)[i] << ", expected " << value(i);
  }
  const std::string file = ReadRaw(path);
  EXPECT_EQ(info->crc32c, Crc32c(file.data(), file.size()));
}

TEST_F(SafetensorsTest, ProducerErrorsFailWriteAndRemoveTheFile) {
  const std::string path = Path("bad.safetensors");
  struct Case {
    const char* what;
    SafetensorsWriter::Producer producer;
    absl::StatusCode code;
    std::vector<std::string> expect;
  };
  const std::vector<uint8_t> six(6, 1);
  std::vector<Case> cases;
  cases.push_back({"too few", [&](const SafetensorsWriter::Sink& sink) { return sink(absl::MakeConstSpan(six)); },
                   absl::StatusCode::kInvalidArgument, {path, "'t'", "delivered 6 bytes", "needs 8"}});
  cases.push_back({"too many",
                   [&](const SafetensorsWriter::Sink& sink) {
                     absl::Status s = sink(absl::MakeConstSpan(six));
                     if (!s.ok()) return s;
                     return sink(absl::MakeConstSpan(six));
                   },
                   absl::StatusCode::kInvalidArgument, {path, "'t'", "more than the 8 bytes"}});
  cases.push_back({"ignores the sink's error",
                   [&](const SafetensorsWriter::Sink& sink) {
                     (void)sink(absl::MakeConstSpan(six));
                     (void)sink(absl::MakeConstSpan(six));
                     (void)sink(absl::MakeConstSpan(six));
                     return absl::OkStatus();
                   },
                   absl::StatusCode::kInvalidArgument, {path, "'t'", "more than the 8 bytes"}});
  cases.push_back({"own error",
                   [](const SafetensorsWriter::Sink&) { return absl::UnavailableError("shard 3 is gone"); },
                   absl::StatusCode::kUnavailable, {path, "'t'", "shard 3 is gone"}});
  for (Case& c : cases) {
    SCOPED_TRACE(c.what);
    SafetensorsWriter writer;
    ASSERT_TRUE(writer.AddTensor("t", SafetensorsDtype::kF32, {2}, std::move(c.producer)).ok());
    absl::StatusOr<SafetensorsFileInfo> info = writer.Write(path);
    ASSERT_FALSE(info.ok());
    EXPECT_EQ(info.status().code(), c.code) << info.status();
    for (const std::string& part : c.expect) EXPECT_TRUE(MessageContains(info.status(), {part}));
    EXPECT_FALSE(std::filesystem::exists(path));
  }
}

TEST_F(SafetensorsTest, WriteErrorNamesThePath) {
  const std::string path = Path("no/such/dir/x.safetensors");
  SafetensorsWriter writer;
  absl::StatusOr<SafetensorsFileInfo> info = writer.Write(path);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MessageContains(info.status(), {path}));

  // A write failing half-way (EFBIG past RLIMIT_FSIZE; SIGXFSZ ignored): the
  // error names the path, the call and the tensor, and the file is removed.
  struct rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct rlimit limit = old_limit;
  limit.rlim_cur = 1 << 20;
  void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  const std::vector<uint8_t> big(4 << 20, 7);
  SafetensorsWriter w2;
  ASSERT_TRUE(w2.AddTensor("t", {static_cast<int64_t>(big.size())}, absl::MakeConstSpan(big)).ok());
  const std::string too_big = Path("too_big.safetensors");
  absl::StatusOr<SafetensorsFileInfo> failed = w2.Write(too_big);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(failed.ok());
  EXPECT_TRUE(MessageContains(failed.status(), {too_big, "write", "'t'"}));
  EXPECT_FALSE(std::filesystem::exists(too_big));
}

// ------------------------------------------------------------------ reader

TEST_F(SafetensorsTest, MissingFileAndDirectory) {
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> r = SafetensorsReader::Open(Path("absent.safetensors"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(MessageContains(r.status(), {Path("absent.safetensors")}));
  r = SafetensorsReader::Open(dir_);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(MessageContains(r.status(), {dir_, "not a regular file"}));
}

TEST_F(SafetensorsTest, RejectsTruncatedFiles) {
  const std::vector<float> a = {1, 2, 3, 4};
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.AddTensor("a", {4}, absl::MakeConstSpan(a)).ok());
  const std::string path = Path("full.safetensors");
  ASSERT_TRUE(writer.Write(path).ok());
  const std::string full = ReadRaw(path);
  ASSERT_TRUE(SafetensorsReader::Open(path).ok());

  EXPECT_TRUE(MessageContains(OpenCorrupt(""), {"truncated", "0 bytes"}));
  EXPECT_TRUE(MessageContains(OpenCorrupt(full.substr(0, 7)), {"truncated", "7 bytes"}));
  EXPECT_TRUE(MessageContains(OpenCorrupt(full.substr(0, 20)), {"header length", "exceeds the file"}));
  // Cut inside the data: tensor 'a' now extends past the end.
  EXPECT_TRUE(MessageContains(OpenCorrupt(full.substr(0, full.size() - 1)),
                              {"tensor 'a'", "extend past the data region", "15 bytes"}));
}

TEST_F(SafetensorsTest, RejectsBadHeaderLength) {
  EXPECT_TRUE(MessageContains(OpenCorrupt(LittleEndian64(uint64_t{1} << 63) + "{}"),
                              {"header length 9223372036854775808", "exceeds the file"}));
  EXPECT_TRUE(MessageContains(OpenCorrupt(LittleEndian64(0)), {"empty header"}));
  EXPECT_TRUE(MessageContains(OpenCorrupt(FileImage("[1, 2]", "")), {"starting with '{'", "0x5b"}));
  // A header length past the 100 MB limit, in a (sparse) file big enough to hold it.
  const std::string path = WriteRaw("huge.safetensors", LittleEndian64(100'000'008) + "{}");
  ASSERT_EQ(truncate(path.c_str(), 100'000'100), 0);
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> r = SafetensorsReader::Open(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageContains(r.status(), {path, "100000008", "limit"}));
}

TEST_F(SafetensorsTest, RejectsBadJson) {
  EXPECT_TRUE(MessageContains(OpenCorrupt(FileImage(R"({"a": {"dtype": "F32",)", "")), {"not valid JSON"}));
  EXPECT_TRUE(MessageContains(OpenCorrupt(FileImage("{} x", "")), {"not valid JSON"}));
  EXPECT_TRUE(MessageContains(OpenCorrupt(FileImage(std::string("{}\0\0", 4), "")), {"NUL byte at offset 10"}));
  EXPECT_TRUE(MessageContains(OpenCorrupt(FileImage(std::string("{}\0junk", 7), "")), {"NUL byte"}));
}

TEST_F(SafetensorsTest, RejectsBadEntries) {
  const std::string four(4, '\0');
  struct Case {
    std::string header;
    std::string data;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {R"({"w":{"dtype":"F17","shape":[1],"data_offsets":[0,4]}})", four,
       {"tensor 'w'", "unknown dtype \"F17\"", "F32"}},
      {R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", four, {"tensor 'w'", "unknown dtype \"f32\""}},
      {R"({"w":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})", four, {"tensor 'w'", "\"dtype\" must be a string"}},
      {R"({"w":{"shape":[1],"data_offsets":[0,4]}})", four, {"tensor 'w'", "missing \"dtype\""}},
      {R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", four, {"tensor 'w'", "missing \"shape\""}},
      {R"({"w":{"dtype":"F32","shape":[1]}})", four, {"tensor 'w'", "missing \"data_offsets\""}},
      {R"({"w":{"dtype":"F32","shape":[1,-1],"data_offsets":[0,4]}})", four,
       {"tensor 'w'", "shape[1] is -1", "non-negative integer"}},
      {R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", four, {"tensor 'w'", "shape[0] is 1.5"}},
      {R"({"w":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})", four, {"tensor 'w'", "\"shape\" must be an array"}},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", four, {"tensor 'w'", "\"data_offsets\" is [0]"}},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", four, {"tensor 'w'", "\"data_offsets\" is"}},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", four, {"tensor 'w'", "[4, 0)", "end before"}},
      {R"({"w":"F32"})", four, {"tensor 'w'", "expected an object"}},
      {R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,12]}})", std::string(12, '\0'),
       {"tensor 'w'", "data_offsets [0, 12) hold 12 bytes, but shape [2, 3] of F32 needs 24"}},
      {R"({"w":{"dtype":"F64","shape":[4611686018427387904,4],"data_offsets":[0,4]}})", four,
       {"tensor 'w'", "overflows"}},
      {R"({"__metadata__":{"step":7}})", "", {"__metadata__['step']", "expected a string"}},
      {R"({"__metadata__":["a"]})", "", {"__metadata__", "expected an object of strings"}},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       four, {"key 'w' more than once"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    EXPECT_TRUE(MessageContains(OpenCorrupt(FileImage(c.header, c.data)), c.expect));
  }
}

TEST_F(SafetensorsTest, RejectsOffsetsThatDoNotTileTheData) {
  const std::string eight(8, '\0');
  EXPECT_TRUE(MessageContains(
      OpenCorrupt(FileImage(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
          eight)),
      {"tensors 'a' [0, 8) and 'b' [4, 8) overlap"}));
  // Same range twice.
  EXPECT_TRUE(MessageContains(
      OpenCorrupt(FileImage(
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
          std::string(4, '\0'))),
      {"overlap"}));
  EXPECT_TRUE(MessageContains(
      OpenCorrupt(FileImage(
          R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
          eight)),
      {"bytes [4, 6) of the data region belong to no tensor", "'b'"}));
  EXPECT_TRUE(MessageContains(OpenCorrupt(FileImage(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight)),
                              {"bytes [0, 4)", "no tensor"}));
  EXPECT_TRUE(MessageContains(OpenCorrupt(FileImage(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight)),
                              {"the data region has 8 bytes", "only the first 4", "4 trailing bytes"}));
  EXPECT_TRUE(MessageContains(OpenCorrupt(FileImage("{}", "x")), {"1 trailing bytes"}));
}

TEST_F(SafetensorsTest, AcceptsFilesFromOtherWriters) {
  // Unpadded header with whitespace, keys in another order, an unknown field,
  // a zero-size tensor between others, and data not in header order.
  const std::string header =
      "{ \"z\": {\"data_offsets\": [0, 2], \"shape\": [2], \"dtype\": \"I8\", \"extra\": 1},\n"
      "  \"e\": {\"dtype\": \"F16\", \"shape\": [0], \"data_offsets\": [2, 2]},\n"
      "  \"a\": {\"dtype\": \"BOOL\", \"shape\": [], \"data_offsets\": [2, 3]},\n"
      "  \"__metadata__\": {} }";
  const std::string path = WriteRaw("other.safetensors", FileImage(header, "\x01\xff\x01"));
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> r = SafetensorsReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->names(), (std::vector<std::string>{"z", "e", "a"}));
  EXPECT_EQ((*r)->Get("z")->dtype, SafetensorsDtype::kI8);
  EXPECT_EQ((*r)->GetAs<int8_t>("z").value()[1], -1);
  EXPECT_EQ((*r)->GetAs<bool>("a").value()[0], true);
  EXPECT_EQ((*r)->Get("e")->data.size(), 0u);
}

TEST(SafetensorsDtypeTest, NamesSizesAndParsing) {
  EXPECT_STREQ(SafetensorsDtypeName(SafetensorsDtype::kF32), "F32");
  EXPECT_STREQ(SafetensorsDtypeName(SafetensorsDtype::kBF16), "BF16");
  EXPECT_STREQ(SafetensorsDtypeName(SafetensorsDtype::kF8E4M3), "F8_E4M3");
  EXPECT_EQ(SafetensorsDtypeSize(SafetensorsDtype::kF64), 8u);
  EXPECT_EQ(SafetensorsDtypeSize(SafetensorsDtype::kU16), 2u);
  EXPECT_EQ(SafetensorsDtypeSize(SafetensorsDtype::kBool), 1u);
  for (const char* name : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
                           "F64", "I64", "U64"}) {
    absl::StatusOr<SafetensorsDtype> d = ParseSafetensorsDtype(name);
    ASSERT_TRUE(d.ok()) << name;
    EXPECT_STREQ(SafetensorsDtypeName(*d), name);
  }
  EXPECT_FALSE(ParseSafetensorsDtype("F32 ").ok());
  static_assert(SafetensorsDtypeOf<float>() == SafetensorsDtype::kF32);
  static_assert(SafetensorsDtypeOf<uint64_t>() == SafetensorsDtype::kU64);
}

}  // namespace
}  // namespace shardwild
