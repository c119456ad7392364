#include "core/io/tfevents.h"

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "core/io/crc32c.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

std::string Hex(const std::string& bytes) { return absl::BytesToHexString(bytes); }

std::string ReadRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ---- A small TFRecord reader and Event decoder, independent of the writer ----

uint64_t Le(const std::string& s, size_t pos, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[pos + i]);
  return v;
}

// Splits a file into record payloads, checking both CRCs of each record.
::testing::AssertionResult ReadRecords(const std::string& file, std::vector<std::string>* records) {
  size_t pos = 0;
  while (pos < file.size()) {
    if (file.size() - pos < 12) return ::testing::AssertionFailure() << "truncated length at " << pos;
    const uint64_t len = Le(file, pos, 8);
    const uint32_t len_crc = static_cast<uint32_t>(Le(file, pos + 8, 4));
    if (UnmaskCrc32c(len_crc) != Crc32c(file.data() + pos, 8)) {
      return ::testing::AssertionFailure() << "bad length CRC at " << pos;
    }
    if (file.size() - pos - 12 < len + 4) return ::testing::AssertionFailure() << "truncated data at " << pos;
    const std::string data = file.substr(pos + 12, len);
    const uint32_t data_crc = static_cast<uint32_t>(Le(file, pos + 12 + len, 4));
    if (UnmaskCrc32c(data_crc) != Crc32c(data.data(), data.size())) {
      return ::testing::AssertionFailure() << "bad data CRC at " << pos;
    }
    records->push_back(data);
    pos += 12 + len + 4;
  }
  return ::testing::AssertionSuccess();
}

struct Field {
  uint32_t number;
  uint32_t wire_type;
  uint64_t varint = 0;  // wire types 0, 1 and 5 (fixed values as raw bits)
  std::string bytes;    // wire type 2
};

// Decodes one protobuf message into its fields; nullopt if malformed.
std::optional<std::vector<Field>> DecodeMessage(const std::string& msg) {
  std::vector<Field> fields;
  size_t pos = 0;
  auto varint = [&](uint64_t* out) {
    *out = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= msg.size()) return false;
      const uint8_t b = static_cast<uint8_t>(msg[pos++]);
      *out |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  };
  while (pos < msg.size()) {
    uint64_t key;
    if (!varint(&key)) return std::nullopt;
    Field f{static_cast<uint32_t>(key >> 3), static_cast<uint32_t>(key & 7), 0, {}};
    switch (f.wire_type) {
      case 0:
        if (!varint(&f.varint)) return std::nullopt;
        break;
      case 1:
      case 5: {
        const int n = f.wire_type == 1 ? 8 : 4;
        if (msg.size() - pos < static_cast<size_t>(n)) return std::nullopt;
        f.varint = Le(msg, pos, n);
        pos += n;
        break;
      }
      case 2: {
        uint64_t len;
        if (!varint(&len) || msg.size() - pos < len) return std::nullopt;
        f.bytes = msg.substr(pos, len);
        pos += len;
        break;
      }
      default:
        return std::nullopt;
    }
    fields.push_back(std::move(f));
  }
  return fields;
}

struct DecodedEvent {
  std::optional<double> wall_time;
  int64_t step = 0;
  std::optional<std::string> file_version;
  std::vector<std::pair<std::string, float>> scalars;
};

::testing::AssertionResult DecodeEvent(const std::string& data, DecodedEvent* ev) {
  std::optional<std::vector<Field>> fields = DecodeMessage(data);
  if (!fields) return ::testing::AssertionFailure() << "malformed Event";
  for (const Field& f : *fields) {
    if (f.number == 1 && f.wire_type == 1) {
      double d;
      std::memcpy(&d, &f.varint, 8);
      ev->wall_time = d;
    } else if (f.number == 2 && f.wire_type == 0) {
      ev->step = static_cast<int64_t>(f.varint);
    } else if (f.number == 3 && f.wire_type == 2) {
      ev->file_version = f.bytes;
    } else if (f.number == 5 && f.wire_type == 2) {
      std::optional<std::vector<Field>> summary = DecodeMessage(f.bytes);
      if (!summary) return ::testing::AssertionFailure() << "malformed Summary";
      for (const Field& v : *summary) {
        if (v.number != 1 || v.wire_type != 2) return ::testing::AssertionFailure() << "unexpected Summary field";
        std::optional<std::vector<Field>> value = DecodeMessage(v.bytes);
        if (!value) return ::testing::AssertionFailure() << "malformed Value";
        std::string tag;
        std::optional<float> simple;
        for (const Field& g : *value) {
          if (g.number == 1 && g.wire_type == 2) tag = g.bytes;
          if (g.number == 2 && g.wire_type == 5) {
            const uint32_t bits = static_cast<uint32_t>(g.varint);
            float x;
            std::memcpy(&x, &bits, 4);
            simple = x;
          }
        }
        if (!simple) return ::testing::AssertionFailure() << "Value without simple_value";
        ev->scalars.emplace_back(tag, *simple);
      }
    } else {
      return ::testing::AssertionFailure() << "unexpected Event field " << f.number;
    }
  }
  return ::testing::AssertionSuccess();
}

class TfEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/tfevents_test_XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr);
    dir_ = templ;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Reads and decodes every record of `path`.
  std::vector<DecodedEvent> ReadEvents(const std::string& path) {
    std::vector<std::string> records;
    EXPECT_TRUE(ReadRecords(ReadRaw(path), &records));
    std::vector<DecodedEvent> events;
    for (const std::string& r : records) {
      DecodedEvent ev;
      EXPECT_TRUE(DecodeEvent(r, &ev));
      events.push_back(std::move(ev));
    }
    return events;
  }

  std::string dir_;
};

// Expected bytes computed once with a few lines of pure Python (crc32c by the
// bitwise definition, struct.pack for the fields).
TEST(TfEventsEncodingTest, ScalarRecordBytes) {
  const ScalarValue v{"loss", 0.25f};
  const std::string event = EncodeScalarsEvent(absl::MakeConstSpan(&v, 1), 7, 1.5);
  EXPECT_EQ(Hex(event), "09000000000000f83f10072a0d0a0b0a046c6f7373150000803e");
  EXPECT_EQ(Hex(EncodeTfRecord(event)),
            "1a00000000000000129bd82d"
            "09000000000000f83f10072a0d0a0b0a046c6f7373150000803e"
            "c9d07b8d");
}

TEST(TfEventsEncodingTest, FileVersionRecordBytes) {
  EXPECT_EQ(Hex(EncodeTfRecord(EncodeFileVersionEvent(1700000000.5))),
            "1800000000000000a37f4b22"
            "0900002040fc54d9411a0d627261696e2e4576656e743a32"
            "2b353110");
}

TEST(TfEventsEncodingTest, SeveralScalarsAndANegativeStep) {
  const std::vector<ScalarValue> values = {{"a", 1.0f}, {"b", -0.5f}};
  EXPECT_EQ(Hex(EncodeScalarsEvent(values, -1, 2.0)),
            "090000000000000040"      // wall_time 2.0
            "10ffffffffffffffffff01"  // step -1: ten varint bytes
            "2a140a080a0161150000803f0a080a016215000000bf");
  // Defaults are omitted as proto3 does: no wall_time, no step; a zero
  // simple_value (in a oneof) is still written.
  const ScalarValue zero{"z", 0.0f};
  EXPECT_EQ(Hex(EncodeScalarsEvent(absl::MakeConstSpan(&zero, 1), 0, 0.0)), "2a0a0a080a017a1500000000");
  EXPECT_EQ(Hex(EncodeTfRecord("")), "000000000000000029039807d8ea82a2");
}

TEST_F(TfEventsTest, WritesAFileTensorBoardCanRead) {
  const double before = Now();
  absl::StatusOr<std::unique_ptr<EventFileWriter>> writer = EventFileWriter::Open(dir_ + "/run1/train");
  ASSERT_TRUE(writer.ok()) << writer.status();
  const double after = Now();
  const std::string path = (*writer)->path();
  const std::string name = std::filesystem::path(path).filename();
  EXPECT_EQ(std::filesystem::path(path).parent_path(), dir_ + "/run1/train");
  ASSERT_TRUE(absl::StartsWith(name, "events.out.tfevents.")) << name;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  EXPECT_TRUE(absl::EndsWith(name, std::string(".") + host)) << name;
  const std::string secs = name.substr(strlen("events.out.tfevents."), 10);
  EXPECT_NEAR(std::stod(secs), before, 2.0);

  // The version record is on disk right after Open.
  std::vector<DecodedEvent> events = ReadEvents(path);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  ASSERT_TRUE(events[0].wall_time.has_value());
  EXPECT_GE(*events[0].wall_time, std::floor(before));
  EXPECT_LE(*events[0].wall_time, after + 1);

  ASSERT_TRUE((*writer)->AddScalar("train/loss", 1, 0.75f, 1000.25).ok());
  ASSERT_TRUE((*writer)->AddScalar("train/loss", 2, 0.5f, 1001.5).ok());
  const std::vector<ScalarValue> several = {{"eval/accuracy", 0.875f}, {"eval/auc", 0.9f}};
  ASSERT_TRUE((*writer)->AddScalars(several, 1LL << 40, 1002.0).ok());
  ASSERT_TRUE((*writer)->AddScalars({}, 3, 1003.0).ok());  // adds nothing
  ASSERT_TRUE((*writer)->AddScalar("now", 4, 1.0f).ok());
  ASSERT_TRUE((*writer)->Flush().ok());

  events = ReadEvents(path);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[1].step, 1);
  EXPECT_EQ(events[1].wall_time, 1000.25);
  EXPECT_EQ(events[1].scalars, (std::vector<std::pair<std::string, float>>{{"train/loss", 0.75f}}));
  EXPECT_EQ(events[2].step, 2);
  EXPECT_EQ(events[2].scalars, (std::vector<std::pair<std::string, float>>{{"train/loss", 0.5f}}));
  EXPECT_EQ(events[3].step, 1LL << 40);
  EXPECT_EQ(events[3].wall_time, 1002.0);
  EXPECT_EQ(events[3].scalars,
            (std::vector<std::pair<std::string, float>>{{"eval/accuracy", 0.875f}, {"eval/auc", 0.9f}}));
  EXPECT_EQ(events[4].step, 4);
  ASSERT_TRUE(events[4].wall_time.has_value());
  EXPECT_GE(*events[4].wall_time, before);

  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_EQ((*writer)->AddScalar("x", 1, 1.0f, 1.0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*writer)->Flush().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*writer)->Close().ok());
}

TEST_F(TfEventsTest, BufferedRecordsReachTheFileOnDestruction) {
  std::string path;
  {
    absl::StatusOr<std::unique_ptr<EventFileWriter>> writer = EventFileWriter::Open(dir_, {.fsync_on_flush = true});
    ASSERT_TRUE(writer.ok()) << writer.status();
    path = (*writer)->path();
    for (int i = 0; i < 5000; ++i) ASSERT_TRUE((*writer)->AddScalar("loss", i, 1.0f / (i + 1), 10.0 + i).ok());
    ASSERT_TRUE((*writer)->Flush().ok());  // with fsync
    ASSERT_TRUE((*writer)->AddScalar("last", 9999, 1.0f, 1.0).ok());
  }
  const std::vector<DecodedEvent> events = ReadEvents(path);
  ASSERT_EQ(events.size(), 5002u);
  for (int i = 0; i < 5000; ++i) {
    ASSERT_EQ(events[1 + i].step, i);
    ASSERT_EQ(events[1 + i].scalars[0].second, 1.0f / (i + 1));
  }
  EXPECT_EQ(events.back().scalars[0].first, "last");
}

TEST_F(TfEventsTest, TwoWritersInOneSecondGetDistinctFiles) {
  std::vector<std::unique_ptr<EventFileWriter>> writers;
  std::set<std::string> paths;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::unique_ptr<EventFileWriter>> w = EventFileWriter::Open(dir_);
    ASSERT_TRUE(w.ok()) << w.status();
    paths.insert((*w)->path());
    writers.push_back(*std::move(w));
  }
  EXPECT_EQ(paths.size(), 3u);
  for (const std::string& p : paths) EXPECT_TRUE(absl::StrContains(p, "tfevents")) << p;
}

TEST_F(TfEventsTest, ConcurrentAddsProduceWholeRecords) {
  absl::StatusOr<std::unique_ptr<EventFileWriter>> writer = EventFileWriter::Open(dir_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const std::string tag = "thread" + std::to_string(t);
      for (int i = 0; i < 500; ++i) EXPECT_TRUE((*writer)->AddScalar(tag, i, static_cast<float>(i), 1.0).ok());
    });
  }
  for (std::thread& th : threads) th.join();
  ASSERT_TRUE((*writer)->Close().ok());
  const std::vector<DecodedEvent> events = ReadEvents((*writer)->path());
  EXPECT_EQ(events.size(), 1u + 4 * 500);
}

TEST_F(TfEventsTest, ErrorsNameTheProblem) {
  absl::StatusOr<std::unique_ptr<EventFileWriter>> writer = EventFileWriter::Open(dir_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  absl::Status s = (*writer)->AddScalar("", 1, 1.0f, 1.0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "empty")) << s;
  s = (*writer)->AddScalar("bad\xc3(", 1, 1.0f, 1.0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "UTF-8")) << s;
  const std::vector<ScalarValue> mixed = {{"ok", 1.0f}, {"\xed\xa0\x80", 2.0f}};  // a surrogate
  EXPECT_FALSE((*writer)->AddScalars(mixed, 1, 1.0).ok());
  EXPECT_TRUE((*writer)->AddScalar("caf\xc3\xa9/\xf0\x9f\x98\x80", 1, 1.0f, 1.0).ok());
  ASSERT_TRUE((*writer)->Flush().ok());
  EXPECT_EQ(ReadEvents((*writer)->path()).size(), 2u);  // the invalid ones added nothing

  // The directory can't be created: a regular file is in the way.
  const std::string blocker = dir_ + "/file";
  std::ofstream(blocker) << "x";
  absl::StatusOr<std::unique_ptr<EventFileWriter>> bad = EventFileWriter::Open(blocker + "/logs");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), blocker + "/logs")) << bad.status();
}

}  // namespace
}  // namespace shardwild
