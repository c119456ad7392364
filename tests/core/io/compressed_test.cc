#include "core/io/compressed.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace shardwild {
namespace {

namespace fs = std::filesystem;

#define EXPECT_HAS(s, sub) EXPECT_NE(std::string(s).find(sub), std::string::npos) << (s)

// Lines of text that compress like data files do, `n` bytes or a little more.
std::string Text(size_t n, uint64_t seed = 1) {
  std::string s;
  uint64_t x = seed;
  while (s.size() < n) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    s += std::to_string(x >> 60) + "\t" + std::to_string((x >> 20) % 100000) + "\tabc" + std::to_string(x % 7) + "\n";
  }
  return s;
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A plain gzip member as zlib's gzip mode writes it (no "SW" subfield).
std::string PlainGzip(const std::string& in) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, in.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(out.size() - z.avail_out);
  deflateEnd(&z);
  return out;
}

// A zstd frame without its content size (a streamed compression, as `zstd`
// writes from a pipe).
std::string StreamedZstd(const std::string& in) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  std::string out(ZSTD_compressBound(in.size()) + 64, '\0');
  ZSTD_outBuffer o{out.data(), out.size(), 0};
  ZSTD_inBuffer i{in.data(), in.size(), 0};
  // Input handed over before the end is announced: the frame's header can't carry the size.
  while (i.pos < i.size) EXPECT_FALSE(ZSTD_isError(ZSTD_compressStream2(c, &o, &i, ZSTD_e_continue)));
  while (ZSTD_compressStream2(c, &o, &i, ZSTD_e_end) != 0) {
  }
  ZSTD_freeCCtx(c);
  out.resize(o.pos);
  return out;
}

std::string TempPath(const std::string& name) {
  return (fs::path(::testing::TempDir()) / (name + "." + std::to_string(getpid()))).string();
}

TEST(CompressedTest, DetectsByMagic) {
  EXPECT_EQ(DetectCompression(PlainGzip("x")), Compression::kGzip);
  EXPECT_EQ(DetectCompression(*CompressBlock("x", Compression::kZstd)), Compression::kZstd);
  EXPECT_EQ(DetectCompression("1\t2\t3\n"), Compression::kNone);
  EXPECT_EQ(DetectCompression("\x1f"), Compression::kNone);
  EXPECT_EQ(*ParseCompression("gz"), Compression::kGzip);
  EXPECT_EQ(*ParseCompression("zstd"), Compression::kZstd);
  EXPECT_EQ(*ParseCompression("none"), Compression::kNone);
  EXPECT_HAS(ParseCompression("bz2").status().message(), "expected gz, zst or none, got 'bz2'");
}

// The writer's blocks come back in parallel, equal to the input, whatever
// the thread counts on either side; the file does not depend on them.
TEST(CompressedTest, WriterBlocksRoundTripInParallel) {
  const std::string text = Text(300000);
  for (Compression c : {Compression::kGzip, Compression::kZstd}) {
    std::string first;
    for (int threads : {1, 3}) {
      const std::string path = TempPath(std::string("rt") + CompressionSuffix(c));
      CompressedWriterOptions o;
      o.compression = c;
      o.block_bytes = 40000;
      o.threads = threads;
      o.sync = false;
      auto w = CompressedFileWriter::Open(path, o);
      ASSERT_TRUE(w.ok()) << w.status();
      // Appends of odd sizes, across block boundaries.
      for (size_t at = 0; at < text.size(); at += 7777) ASSERT_TRUE((*w)->Append(std::string_view(text).substr(at, 7777)).ok());
      ASSERT_TRUE((*w)->Commit().ok());
      EXPECT_EQ((*w)->bytes_in(), text.size());
      const std::string file = Slurp(path);
      EXPECT_EQ((*w)->bytes_out(), file.size());
      EXPECT_LT(file.size(), text.size() / 2);
      if (first.empty()) first = file;
      EXPECT_EQ(file, first) << "the bytes depend on the thread count";
      for (int read_threads : {1, 4}) {
        DecompressStats st;
        DecompressOptions d;
        d.threads = read_threads;
        absl::StatusOr<std::string> back = Decompress(file, DetectCompression(file), path, d, &st);
        ASSERT_TRUE(back.ok()) << back.status();
        EXPECT_TRUE(*back == text);
        EXPECT_TRUE(st.parallel);
        EXPECT_EQ(st.pieces, static_cast<int64_t>((text.size() + 39999) / 40000));
      }
      fs::remove(path);
    }
  }
}

// gzip and zstd themselves read what the writer wrote (the "SW" subfield is
// a valid gzip extra field), and an empty input is one empty member.
TEST(CompressedTest, ToolsReadTheWritersFiles) {
  const std::string text = Text(100000);
  for (Compression c : {Compression::kGzip, Compression::kZstd}) {
    for (const std::string& input : {text, std::string()}) {
      const std::string path = TempPath(std::string("tool") + CompressionSuffix(c));
      CompressedWriterOptions o;
      o.compression = c;
      o.block_bytes = 30000;
      o.sync = false;
      auto w = CompressedFileWriter::Open(path, o);
      ASSERT_TRUE(w.ok());
      ASSERT_TRUE((*w)->Append(input).ok());
      ASSERT_TRUE((*w)->Commit().ok());
      const std::string tool = c == Compression::kGzip ? "gzip" : "zstd";
      if (std::system(("command -v " + tool + " >/dev/null").c_str()) != 0) {
        GTEST_SKIP() << tool << " is not installed";
      }
      const std::string cmd = tool + " -dc < " + path + (c == Compression::kZstd ? " -q" : "");
      FILE* p = popen(cmd.c_str(), "r");
      ASSERT_NE(p, nullptr);
      std::string got;
      char buf[65536];
      for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) got.append(buf, n);
      EXPECT_EQ(pclose(p), 0) << cmd;
      EXPECT_TRUE(got == input) << cmd << ": " << got.size() << " bytes, want " << input.size();
      fs::remove(path);
    }
  }
}

// Files other tools wrote: plain gzip members (one after another) and zstd
// frames without a content size are read in order on one thread.
TEST(CompressedTest, OtherToolsFilesAreReadSequentially) {
  const std::string a = Text(150000, 2), b = Text(50000, 3);
  const std::string gz = PlainGzip(a) + PlainGzip(b);
  DecompressStats st;
  absl::StatusOr<std::string> got = Decompress(gz, Compression::kGzip, "x.gz", {}, &st);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == a + b);
  EXPECT_FALSE(st.parallel);
  EXPECT_EQ(st.pieces, 2);
  // One of ours, then a plain member: the whole file is read sequentially.
  got = Decompress(*CompressBlock(a, Compression::kGzip) + PlainGzip(b), Compression::kGzip, "x.gz", {}, &st);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == a + b);
  EXPECT_FALSE(st.parallel);

  const std::string zst = StreamedZstd(a) + *CompressBlock(b, Compression::kZstd);
  got = Decompress(zst, Compression::kZstd, "x.zst", {}, &st);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == a + b);
  EXPECT_FALSE(st.parallel);
  EXPECT_EQ(st.pieces, 2);
}

// Damage anywhere is one error naming the file, the format and the member
// or frame's byte offset; nothing is silently dropped.
TEST(CompressedTest, DamageIsOneErrorNamingTheOffset) {
  const std::string a = Text(50000, 4), b = Text(50000, 5);
  for (bool ours : {true, false}) {
    const std::string first = ours ? *CompressBlock(a, Compression::kGzip) : PlainGzip(a);
    const std::string second = ours ? *CompressBlock(b, Compression::kGzip) : PlainGzip(b);
    const std::string good = first + second;
    const std::string at = std::to_string(first.size());
    struct Case {
      std::string data, want;
    };
    std::string flipped = good;
    flipped[first.size() + second.size() / 2] ^= 0x5a;
    std::string bad_crc = good;
    bad_crc[good.size() - 8] ^= 1;
    const Case cases[] = {
        {good.substr(0, good.size() - 100), ours ? "the member at byte " + at + " says it is" : "the member at byte " + at + " is truncated"},
        {flipped, "the member at byte " + at + " "},
        {bad_crc, "the member at byte " + at + " "},
        {good + "trailing junk", "bytes after the last member (at byte " + std::to_string(good.size()) + ") are not a gzip member"},
    };
    for (const Case& c : cases) {
      absl::StatusOr<std::string> got = Decompress(c.data, Compression::kGzip, "day_1.tsv.gz");
      ASSERT_FALSE(got.ok()) << (ours ? "ours " : "plain ") << c.want;
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_HAS(got.status().message(), "day_1.tsv.gz: gzip: ");
      EXPECT_HAS(got.status().message(), c.want);
    }
  }
  const std::string fa = *CompressBlock(a, Compression::kZstd);
  const std::string zgood = fa + *CompressBlock(b, Compression::kZstd);
  std::string zflip = zgood;
  zflip[fa.size() + 200] ^= 0x5a;
  for (const std::string& bad : {zgood.substr(0, zgood.size() - 10), zflip, zgood + "junk"}) {
    absl::StatusOr<std::string> got = Decompress(bad, Compression::kZstd, "day_2.tsv.zst");
    ASSERT_FALSE(got.ok());
    EXPECT_HAS(got.status().message(), "day_2.tsv.zst: zstd: the frame at byte ");
  }
  absl::StatusOr<std::string> z = Decompress(zgood.substr(0, zgood.size() - 10), Compression::kZstd, "z");
  EXPECT_HAS(z.status().message(), "the frame at byte " + std::to_string(fa.size()));
}

TEST(CompressedTest, OutputLimitIsResourceExhausted) {
  const std::string big(1 << 20, 'a');
  for (Compression c : {Compression::kGzip, Compression::kZstd}) {
    DecompressOptions o;
    o.max_output_bytes = 1000;
    for (const std::string& data : {*CompressBlock(big, c), c == Compression::kGzip ? PlainGzip(big) : StreamedZstd(big)}) {
      absl::StatusOr<std::string> got = Decompress(data, c, "bomb", o);
      EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << got.status();
      EXPECT_HAS(got.status().message(), "bomb: decompresses to more than 1000 bytes");
    }
  }
}

// DecompressingReader: any file read piece by piece, or a run of whole
// members, equals the decompressed bytes; a cut file is an error naming the
// member's offset, never a short read.
TEST(CompressedTest, ReaderReadsRangesPieceByPiece) {
  const std::string a = Text(70000, 8), b = Text(50000, 9), c = Text(30000, 10);
  struct Case {
    std::string name;
    Compression comp;
    std::string bytes;
  };
  const std::string ga = *CompressBlock(a, Compression::kGzip), gb = *CompressBlock(b, Compression::kGzip);
  const std::vector<Case> cases = {
      {"ours.gz", Compression::kGzip, ga + gb + *CompressBlock(c, Compression::kGzip)},
      {"plain.gz", Compression::kGzip, PlainGzip(a) + PlainGzip(b) + PlainGzip(c)},
      {"frames.zst", Compression::kZstd, *CompressBlock(a, Compression::kZstd) + StreamedZstd(b) + *CompressBlock(c, Compression::kZstd)},
      {"plain.txt", Compression::kNone, a + b + c},
  };
  for (const Case& k : cases) {
    const std::string path = TempPath(k.name);
    std::ofstream(path, std::ios::binary) << k.bytes;
    for (size_t piece : {size_t{1000}, size_t{1} << 20}) {
      absl::StatusOr<std::unique_ptr<DecompressingReader>> r = DecompressingReader::Open(path, k.comp);
      ASSERT_TRUE(r.ok()) << r.status();
      std::string out;
      while (true) {
        absl::StatusOr<size_t> n = (*r)->Read(&out, piece);
        ASSERT_TRUE(n.ok()) << k.name << ": " << n.status();
        ASSERT_LE(*n, piece);
        if (*n == 0) break;
      }
      EXPECT_TRUE(out == a + b + c) << k.name;
    }
    // Cut inside its last member or frame.
    const std::string cut_path = TempPath("cut_" + k.name);
    std::ofstream(cut_path, std::ios::binary) << k.bytes.substr(0, k.bytes.size() - 20);
    absl::StatusOr<std::unique_ptr<DecompressingReader>> r = DecompressingReader::Open(cut_path, k.comp);
    ASSERT_TRUE(r.ok());
    std::string out;
    absl::Status status;
    while (true) {
      absl::StatusOr<size_t> n = (*r)->Read(&out, 4096);
      if (!n.ok()) {
        status = n.status();
        break;
      }
      if (*n == 0) break;
    }
    if (k.comp == Compression::kNone) {
      EXPECT_TRUE(status.ok());
    } else {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << k.name;
      EXPECT_HAS(status.message(), cut_path + ": " + CompressionName(k.comp) + ": the ");
      EXPECT_HAS(status.message(), " is truncated");
    }
    fs::remove(path);
    fs::remove(cut_path);
  }
  // A range of whole members: the second one alone.
  const std::string path = TempPath("range.gz");
  std::ofstream(path, std::ios::binary) << ga + gb;
  absl::StatusOr<std::unique_ptr<DecompressingReader>> r =
      DecompressingReader::Open(path, Compression::kGzip, static_cast<int64_t>(ga.size()), static_cast<int64_t>(ga.size() + gb.size()));
  ASSERT_TRUE(r.ok());
  std::string out;
  while (*(*r)->Read(&out, 5000) > 0) {
  }
  EXPECT_TRUE(out == b);
  fs::remove(path);
  EXPECT_EQ(DecompressingReader::Open(TempPath("none"), Compression::kGzip).status().code(), absl::StatusCode::kNotFound);
}

TEST(CompressedTest, BadWriterOptions) {
  CompressedWriterOptions o;
  o.block_bytes = 100;
  EXPECT_HAS(CompressedFileWriter::Open(TempPath("bad"), o).status().message(), "block size must be in [4096");
  o.block_bytes = 4096;
  o.level = 12;
  EXPECT_HAS(CompressedFileWriter::Open(TempPath("bad"), o).status().message(), "gzip level must be in [1, 9], got 12");
}

}  // namespace
}  // namespace shardwild
