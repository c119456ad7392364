#include "core/io/compressed.h"

#include <zlib.h>
#include <zstd.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/base/parallel_for.h"
#include "core/base/status.h"
#include "core/io/atomic_file.h"

namespace shardwild {
namespace {

constexpr unsigned char kGzipMagic[2] = {0x1f, 0x8b};
constexpr unsigned char kZstdMagic[4] = {0x28, 0xb5, 0x2f, 0xfd};
// The gzip header CompressedFileWriter writes: 10 fixed bytes, XLEN (2),
// then one subfield 'S' 'W', LEN 4, the member's size (uint32 LE).
constexpr size_t kSwHeaderBytes = 20;
constexpr size_t kGzipTrailerBytes = 8;  // CRC-32, ISIZE
constexpr unsigned char kFlagHcrc = 2, kFlagExtra = 4, kFlagName = 8, kFlagComment = 16;

uint32_t Le32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
uint16_t Le16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
void PutLe32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status Damaged(std::string_view name, const char* format, uint64_t at, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(AV(name), ": ", format, ": the ", std::string_view(format) == "zstd" ? "frame" : "member",
                                                 " at byte ", at, " ", what));
}

absl::Status TooBig(std::string_view name, uint64_t limit) {
  return absl::ResourceExhaustedError(
      absl::StrCat(AV(name), ": decompresses to more than ", limit, " bytes (the limit of this read)"));
}

// ---- gzip ----------------------------------------------------------------------

// The length of the gzip header at data[0..) and, when it carries an "SW"
// subfield, the member's size. nullopt header length = not a whole header.
struct GzipHeader {
  size_t length = 0;
  uint32_t member_bytes = 0;  // 0 = no "SW" subfield
};
std::optional<GzipHeader> ParseGzipHeader(std::string_view data) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  if (data.size() < 10 || p[0] != kGzipMagic[0] || p[1] != kGzipMagic[1] || p[2] != 8) return std::nullopt;
  const unsigned char flags = p[3];
  if (flags & 0xe0) return std::nullopt;  // reserved bits (zlib refuses them)
  GzipHeader h;
  size_t at = 10;
  if (flags & kFlagExtra) {
    if (data.size() < at + 2) return std::nullopt;
    const size_t xlen = Le16(p + at);
    at += 2;
    if (data.size() < at + xlen) return std::nullopt;
    for (size_t s = at; s + 4 <= at + xlen;) {
      const size_t len = Le16(p + s + 2);
      if (s + 4 + len > at + xlen) break;
      if (p[s] == 'S' && p[s + 1] == 'W' && len == 4) h.member_bytes = Le32(p + s + 4);
      s += 4 + len;
    }
    at += xlen;
  }
  for (unsigned char flag : {kFlagName, kFlagComment}) {
    if (flags & flag) {
      const size_t end = data.find('\0', at);
      if (end == std::string_view::npos) return std::nullopt;
      at = end + 1;
    }
  }
  if (flags & kFlagHcrc) {
    // The low 16 bits of the header's CRC-32, checked as zlib does.
    if (data.size() < at + 2 || (crc32(0L, p, static_cast<uInt>(at)) & 0xffff) != Le16(p + at)) return std::nullopt;
    at += 2;
  }
  if (at > data.size()) return std::nullopt;
  h.length = at;
  return h;
}

// One member whose bounds are known: inflates data (the whole member) into
// out[0..size) and checks its CRC-32 and length.
absl::Status InflateMember(std::string_view member, size_t header, char* out, size_t size, std::string_view name,
                           uint64_t at) {
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) return absl::ResourceExhaustedError(absl::StrCat(AV(name), ": zlib: no memory"));
  const size_t body = member.size() - header - kGzipTrailerBytes;
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(member.data() + header));
  z.avail_in = static_cast<uInt>(body);
  z.next_out = reinterpret_cast<Bytef*>(out);
  z.avail_out = static_cast<uInt>(size);
  const int r = inflate(&z, Z_FINISH);
  const std::string msg = z.msg ? z.msg : "bad data";
  const size_t produced = size - z.avail_out;
  const size_t left = z.avail_in;
  inflateEnd(&z);
  if (r == Z_DATA_ERROR || r == Z_NEED_DICT) return Damaged(name, "gzip", at, absl::StrCat("is corrupt (", msg, ")"));
  if (r != Z_STREAM_END) {
    return Damaged(name, "gzip", at,
                   produced == size && left > 0 ? "holds more data than its length field says" : "is truncated");
  }
  if (left != 0) return Damaged(name, "gzip", at, "has bytes between its data and its trailer");
  const auto* trailer = reinterpret_cast<const unsigned char*>(member.data() + member.size() - kGzipTrailerBytes);
  if (produced != size) return Damaged(name, "gzip", at, "holds less data than its length field says");
  const uint32_t crc = static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(out), static_cast<uInt>(size)));
  if (crc != Le32(trailer)) return Damaged(name, "gzip", at, "fails its CRC-32 check");
  return absl::OkStatus();
}

// Every member's bounds, when each carries the "SW" subfield; nullopt when
// one does not (then the file is read member by member).
struct Piece {
  size_t offset = 0, size = 0;  // in the input
  size_t header = 0;            // gzip: header bytes
  uint64_t out_offset = 0, out_size = 0;
};
absl::StatusOr<std::optional<std::vector<Piece>>> SplitGzip(std::string_view data, std::string_view name) {
  std::vector<Piece> pieces;
  uint64_t out = 0;
  for (size_t at = 0; at < data.size();) {
    const std::optional<GzipHeader> h = ParseGzipHeader(data.substr(at));
    if (!h || h->member_bytes == 0) return std::optional<std::vector<Piece>>();
    if (h->member_bytes < h->length + kGzipTrailerBytes || h->member_bytes > data.size() - at) {
      return Damaged(name, "gzip", at, absl::StrCat("says it is ", h->member_bytes, " bytes long, but ",
                                                    data.size() - at, " are left in the file"));
    }
    Piece p;
    p.offset = at;
    p.size = h->member_bytes;
    p.header = h->length;
    p.out_offset = out;
    p.out_size = Le32(reinterpret_cast<const unsigned char*>(data.data() + at + p.size - 4));
    out += p.out_size;
    pieces.push_back(p);
    at += p.size;
  }
  return std::optional<std::vector<Piece>>(std::move(pieces));
}

// Any gzip file, one member after another on this thread.
absl::StatusOr<std::string> InflateSequential(std::string_view data, std::string_view name, uint64_t limit,
                                              int64_t* members) {
  std::string out;
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return absl::ResourceExhaustedError(absl::StrCat(AV(name), ": zlib: no memory"));
  size_t member_at = 0;
  size_t consumed = 0;  // input bytes handed to zlib and used
  std::string buffer(size_t{1} << 20, '\0');
  absl::Status status;
  *members = 0;
  while (true) {
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data() + consumed));
    const size_t avail = std::min<size_t>(data.size() - consumed, size_t{1} << 30);
    z.avail_in = static_cast<uInt>(avail);
    z.next_out = reinterpret_cast<Bytef*>(buffer.data());
    z.avail_out = static_cast<uInt>(buffer.size());
    const int r = inflate(&z, Z_NO_FLUSH);
    consumed += avail - z.avail_in;
    const size_t produced = buffer.size() - z.avail_out;
    if (out.size() + produced > limit) {
      status = TooBig(name, limit);
      break;
    }
    out.append(buffer.data(), produced);
    if (r == Z_STREAM_END) {
      ++*members;
      if (consumed == data.size()) break;
      if (data.size() - consumed < 2 || static_cast<unsigned char>(data[consumed]) != kGzipMagic[0] ||
          static_cast<unsigned char>(data[consumed + 1]) != kGzipMagic[1]) {
        status = absl::InvalidArgumentError(absl::StrCat(AV(name), ": gzip: ", data.size() - consumed,
                                                         " bytes after the last member (at byte ", consumed,
                                                         ") are not a gzip member"));
        break;
      }
      member_at = consumed;
      inflateReset(&z);
      continue;
    }
    if (r == Z_OK) continue;
    if (r == Z_BUF_ERROR && consumed == data.size()) {
      status = Damaged(name, "gzip", member_at, "is truncated");
    } else {
      status = Damaged(name, "gzip", member_at, absl::StrCat("is corrupt (", z.msg ? z.msg : "bad data", ")"));
    }
    break;
  }
  inflateEnd(&z);
  if (!status.ok()) return status;
  return out;
}

// ---- zstd ----------------------------------------------------------------------

std::string ZstdError(size_t code) { return ZSTD_getErrorName(code); }

absl::StatusOr<std::optional<std::vector<Piece>>> SplitZstd(std::string_view data, std::string_view name) {
  std::vector<Piece> pieces;
  uint64_t out = 0;
  for (size_t at = 0; at < data.size();) {
    const size_t n = ZSTD_findFrameCompressedSize(data.data() + at, data.size() - at);
    if (ZSTD_isError(n)) {
      return Damaged(name, "zstd", at, absl::StrCat("is truncated or damaged (", ZstdError(n), ")"));
    }
    const unsigned long long content = ZSTD_getFrameContentSize(data.data() + at, data.size() - at);
    if (content == ZSTD_CONTENTSIZE_ERROR) return Damaged(name, "zstd", at, "has a damaged header");
    if (content == ZSTD_CONTENTSIZE_UNKNOWN) return std::optional<std::vector<Piece>>();
    Piece p;
    p.offset = at;
    p.size = n;
    p.out_offset = out;
    p.out_size = content;
    out += content;
    pieces.push_back(p);
    at += n;
  }
  return std::optional<std::vector<Piece>>(std::move(pieces));
}

absl::Status DecompressFrame(std::string_view frame, char* out, size_t size, std::string_view name, uint64_t at) {
  ZSTD_DCtx* ctx = ZSTD_createDCtx();
  if (ctx == nullptr) return absl::ResourceExhaustedError(absl::StrCat(AV(name), ": zstd: no memory"));
  const size_t n = ZSTD_decompressDCtx(ctx, out, size, frame.data(), frame.size());
  ZSTD_freeDCtx(ctx);
  if (ZSTD_isError(n)) return Damaged(name, "zstd", at, absl::StrCat("is corrupt (", ZstdError(n), ")"));
  if (n != size) return Damaged(name, "zstd", at, "holds less data than its header says");
  return absl::OkStatus();
}

absl::StatusOr<std::string> ZstdSequential(std::string_view data, std::string_view name, uint64_t limit,
                                           int64_t* frames) {
  ZSTD_DCtx* ctx = ZSTD_createDCtx();
  if (ctx == nullptr) return absl::ResourceExhaustedError(absl::StrCat(AV(name), ": zstd: no memory"));
  std::string out;
  std::string buffer(ZSTD_DStreamOutSize(), '\0');
  ZSTD_inBuffer in{data.data(), data.size(), 0};
  size_t frame_at = 0;
  absl::Status status;
  *frames = 0;
  while (true) {
    ZSTD_outBuffer o{buffer.data(), buffer.size(), 0};
    const size_t hint = ZSTD_decompressStream(ctx, &o, &in);
    if (ZSTD_isError(hint)) {
      status = Damaged(name, "zstd", frame_at, absl::StrCat("is corrupt (", ZstdError(hint), ")"));
      break;
    }
    if (out.size() + o.pos > limit) {
      status = TooBig(name, limit);
      break;
    }
    out.append(buffer.data(), o.pos);
    if (hint == 0) {  // a frame ended
      ++*frames;
      frame_at = in.pos;
      if (in.pos == in.size) break;
      continue;
    }
    if (in.pos == in.size && o.pos < o.size) {  // it wants input there is not
      status = Damaged(name, "zstd", frame_at, "is truncated");
      break;
    }
  }
  ZSTD_freeDCtx(ctx);
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<std::string> DecompressPieces(std::string_view data, const std::vector<Piece>& pieces, Compression c,
                                             std::string_view name, const DecompressOptions& options) {
  const uint64_t total = pieces.empty() ? 0 : pieces.back().out_offset + pieces.back().out_size;
  if (total > options.max_output_bytes) return TooBig(name, options.max_output_bytes);
  std::string out;
  try {
    out.resize(total);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(AV(name), ": out of memory for ", total, " decompressed bytes"));
  }
  SW_RETURN_IF_ERROR(ParallelForStatus(options.threads, static_cast<int64_t>(pieces.size()), [&](int64_t i) {
    const Piece& p = pieces[static_cast<size_t>(i)];
    const std::string_view piece = data.substr(p.offset, p.size);
    char* dst = out.data() + p.out_offset;
    return c == Compression::kGzip ? InflateMember(piece, p.header, dst, p.out_size, name, p.offset)
                                   : DecompressFrame(piece, dst, p.out_size, name, p.offset);
  }));
  return out;
}

// ---- writing ---------------------------------------------------------------------

absl::StatusOr<std::string> GzipBlock(std::string_view bytes, int level) {
  z_stream z{};
  if (deflateInit2(&z, level == 0 ? 6 : level, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return absl::ResourceExhaustedError("zlib: no memory");
  }
  const uLong bound = deflateBound(&z, static_cast<uLong>(bytes.size()));
  std::string out(kSwHeaderBytes + bound + kGzipTrailerBytes, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data() + kSwHeaderBytes);
  z.avail_out = static_cast<uInt>(bound);
  const int r = deflate(&z, Z_FINISH);
  const size_t body = bound - z.avail_out;
  deflateEnd(&z);
  if (r != Z_STREAM_END) return absl::InternalError("zlib: deflate did not finish a block");
  out.resize(kSwHeaderBytes + body + kGzipTrailerBytes);
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  const unsigned char header[12] = {kGzipMagic[0], kGzipMagic[1], 8, kFlagExtra, 0, 0, 0, 0, 0, 255, 8, 0};
  std::memcpy(p, header, sizeof header);
  p[12] = 'S';
  p[13] = 'W';
  p[14] = 4;
  p[15] = 0;
  PutLe32(p + 16, static_cast<uint32_t>(out.size()));
  const uint32_t crc =
      static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
  PutLe32(p + kSwHeaderBytes + body, crc);
  PutLe32(p + kSwHeaderBytes + body + 4, static_cast<uint32_t>(bytes.size()));
  return out;
}

absl::StatusOr<std::string> ZstdBlock(std::string_view bytes, int level) {
  ZSTD_CCtx* ctx = ZSTD_createCCtx();
  if (ctx == nullptr) return absl::ResourceExhaustedError("zstd: no memory");
  ZSTD_CCtx_setParameter(ctx, ZSTD_c_compressionLevel, level == 0 ? 3 : level);
  ZSTD_CCtx_setParameter(ctx, ZSTD_c_checksumFlag, 1);
  std::string out(ZSTD_compressBound(bytes.size()), '\0');
  const size_t n = ZSTD_compress2(ctx, out.data(), out.size(), bytes.data(), bytes.size());
  ZSTD_freeCCtx(ctx);
  if (ZSTD_isError(n)) return absl::InternalError(absl::StrCat("zstd: ", ZstdError(n)));
  out.resize(n);
  return out;
}

}  // namespace

const char* CompressionName(Compression c) {
  switch (c) {
    case Compression::kNone: return "none";
    case Compression::kGzip: return "gzip";
    case Compression::kZstd: return "zstd";
  }
  return "none";
}

const char* CompressionSuffix(Compression c) {
  switch (c) {
    case Compression::kNone: return "";
    case Compression::kGzip: return ".gz";
    case Compression::kZstd: return ".zst";
  }
  return "";
}

Compression DetectCompression(std::string_view b) {
  if (b.size() >= 4 && std::memcmp(b.data(), kZstdMagic, 4) == 0) return Compression::kZstd;
  // A skippable frame first (magic 0x184D2A5?): zstd too.
  if (b.size() >= 4 && (static_cast<unsigned char>(b[0]) & 0xf0) == 0x50 && static_cast<unsigned char>(b[1]) == 0x2a &&
      static_cast<unsigned char>(b[2]) == 0x4d && static_cast<unsigned char>(b[3]) == 0x18) {
    return Compression::kZstd;
  }
  if (b.size() >= 4 && static_cast<unsigned char>(b[0]) == kGzipMagic[0] &&
      static_cast<unsigned char>(b[1]) == kGzipMagic[1] && b[2] == 8) {
    return Compression::kGzip;
  }
  return Compression::kNone;
}

absl::StatusOr<Compression> ParseCompression(std::string_view name) {
  if (name.empty() || name == "none") return Compression::kNone;
  if (name == "gz" || name == "gzip") return Compression::kGzip;
  if (name == "zst" || name == "zstd") return Compression::kZstd;
  return absl::InvalidArgumentError(absl::StrCat("compression: expected gz, zst or none, got '", AV(name), "'"));
}

absl::StatusOr<std::string> Decompress(std::string_view data, Compression c, std::string_view name,
                                       const DecompressOptions& options, DecompressStats* stats) {
  DecompressStats local;
  DecompressStats& st = stats ? *stats : local;
  st = DecompressStats();
  if (c == Compression::kNone) {
    if (data.size() > options.max_output_bytes) return TooBig(name, options.max_output_bytes);
    return std::string(data);
  }
  if (data.empty()) return std::string();  // no member or frame: nothing
  std::optional<std::vector<Piece>> pieces;
  if (!options.sequential) {
    SW_ASSIGN_OR_RETURN(pieces, c == Compression::kGzip ? SplitGzip(data, name) : SplitZstd(data, name));
  }
  if (pieces) {
    st.pieces = static_cast<int64_t>(pieces->size());
    st.parallel = true;
    return DecompressPieces(data, *pieces, c, name, options);
  }
  return c == Compression::kGzip ? InflateSequential(data, name, options.max_output_bytes, &st.pieces)
                                 : ZstdSequential(data, name, options.max_output_bytes, &st.pieces);
}

absl::StatusOr<std::optional<std::vector<SizedGzipMember>>> ListSizedGzipMembers(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot open: ", std::strerror(e)));
  }
  const off_t size = ::lseek(fd, 0, SEEK_END);
  std::vector<SizedGzipMember> members;
  bool sized = size >= 0;
  char head[512];
  for (int64_t at = 0; sized && at < size;) {
    const ssize_t n = ::pread(fd, head, sizeof head, at);
    const std::optional<GzipHeader> h = n > 0 ? ParseGzipHeader(std::string_view(head, static_cast<size_t>(n)))
                                              : std::nullopt;
    unsigned char isize[4];
    if (!h || h->member_bytes < h->length + kGzipTrailerBytes || at + h->member_bytes > size ||
        ::pread(fd, isize, 4, at + h->member_bytes - 4) != 4) {
      sized = false;
      break;
    }
    members.push_back({at, h->member_bytes, Le32(isize)});
    at += h->member_bytes;
  }
  ::close(fd);
  if (!sized) return std::optional<std::vector<SizedGzipMember>>();
  return std::optional<std::vector<SizedGzipMember>>(std::move(members));
}

absl::StatusOr<std::unique_ptr<DecompressingReader>> DecompressingReader::Open(const std::string& path, Compression c,
                                                                              int64_t begin, int64_t end) {
  std::unique_ptr<DecompressingReader> r(new DecompressingReader());
  r->path_ = path;
  r->c_ = c;
  r->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (r->fd_ < 0) {
    const int e = errno;
    if (e == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot open: ", std::strerror(e)));
  }
  if (end < 0) {
    const off_t size = ::lseek(r->fd_, 0, SEEK_END);
    if (size < 0) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot seek: ", std::strerror(errno)));
    end = size;
  }
  r->pos_ = r->in_offset_ = r->member_at_ = begin;
  r->end_ = end;
  if (c == Compression::kGzip) {
    auto* z = new z_stream{};
    if (inflateInit2(z, 16 + MAX_WBITS) != Z_OK) {
      delete z;
      return absl::ResourceExhaustedError(absl::StrCat(path, ": zlib: no memory"));
    }
    r->z_ = z;
  } else if (c == Compression::kZstd) {
    r->zstd_ = ZSTD_createDCtx();
    if (r->zstd_ == nullptr) return absl::ResourceExhaustedError(absl::StrCat(path, ": zstd: no memory"));
  }
  return r;
}

DecompressingReader::~DecompressingReader() {
  if (z_ != nullptr) {
    inflateEnd(static_cast<z_stream*>(z_));
    delete static_cast<z_stream*>(z_);
  }
  if (zstd_ != nullptr) ZSTD_freeDCtx(static_cast<ZSTD_DCtx*>(zstd_));
  if (fd_ >= 0) ::close(fd_);
}

absl::Status DecompressingReader::Fill() {
  if (in_at_ > 0) {
    in_.erase(0, in_at_);
    in_offset_ += static_cast<int64_t>(in_at_);
    in_at_ = 0;
  }
  const size_t want = static_cast<size_t>(std::min<int64_t>(int64_t{1} << 20, end_ - pos_));
  if (want == 0) return absl::OkStatus();
  const size_t had = in_.size();
  in_.resize(had + want);
  size_t got = 0;
  while (got < want) {
    const ssize_t n = ::pread(fd_, in_.data() + had + got, want - got, static_cast<off_t>(pos_ + static_cast<int64_t>(got)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat(path_, ": read: ", std::strerror(errno)));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  in_.resize(had + got);
  pos_ += static_cast<int64_t>(got);
  if (got < want) end_ = pos_;  // the file is shorter than it was
  return absl::OkStatus();
}

absl::StatusOr<size_t> DecompressingReader::Read(std::string* out, size_t max) {
  const size_t start = out->size();
  while (out->size() - start < max) {
    if (in_at_ == in_.size()) {
      SW_RETURN_IF_ERROR(Fill());
      if (in_at_ == in_.size()) {  // the range is read
        if (member_open_) {
          return absl::InvalidArgumentError(absl::StrCat(path_, ": ", CompressionName(c_), ": the ",
                                                         c_ == Compression::kZstd ? "frame" : "member", " at byte ",
                                                         member_at_, " is truncated"));
        }
        break;
      }
    }
    const size_t room = max - (out->size() - start);
    const char* in = in_.data() + in_at_;
    const size_t avail = in_.size() - in_at_;
    if (c_ == Compression::kNone) {
      const size_t n = std::min(room, avail);
      out->append(in, n);
      in_at_ += n;
      continue;
    }
    const size_t had = out->size();
    out->resize(had + room);
    if (c_ == Compression::kGzip) {
      auto* z = static_cast<z_stream*>(z_);
      if (!member_open_) {
        if (avail < 2 || static_cast<unsigned char>(in[0]) != kGzipMagic[0] ||
            static_cast<unsigned char>(in[1]) != kGzipMagic[1]) {
          if (avail < 2 && pos_ < end_) {  // a header split by the buffer
            out->resize(had);
            SW_RETURN_IF_ERROR(Fill());
            continue;
          }
          out->resize(had);
          return absl::InvalidArgumentError(absl::StrCat(path_, ": gzip: ", end_ - in_offset_ - static_cast<int64_t>(in_at_),
                                                         " bytes at byte ", in_offset_ + static_cast<int64_t>(in_at_),
                                                         " are not a gzip member"));
        }
        member_at_ = in_offset_ + static_cast<int64_t>(in_at_);
        member_open_ = true;
        inflateReset(z);
      }
      z->next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in));
      z->avail_in = static_cast<uInt>(std::min<size_t>(avail, size_t{1} << 30));
      z->next_out = reinterpret_cast<Bytef*>(out->data() + had);
      z->avail_out = static_cast<uInt>(std::min<size_t>(room, size_t{1} << 30));
      const uInt before_in = z->avail_in, before_out = z->avail_out;
      const int r = inflate(z, Z_NO_FLUSH);
      in_at_ += before_in - z->avail_in;
      out->resize(had + (before_out - z->avail_out));
      if (r == Z_STREAM_END) {
        member_open_ = false;
      } else if (r == Z_DATA_ERROR || r == Z_NEED_DICT || r == Z_MEM_ERROR) {
        return absl::InvalidArgumentError(absl::StrCat(path_, ": gzip: the member at byte ", member_at_, " is corrupt (",
                                                       z->msg ? z->msg : "bad data", ")"));
      } else if (r == Z_BUF_ERROR && before_in == z->avail_in && before_out == z->avail_out) {
        // It needs more input than is buffered.
        if (pos_ >= end_) {
          return absl::InvalidArgumentError(
              absl::StrCat(path_, ": gzip: the member at byte ", member_at_, " is truncated"));
        }
        SW_RETURN_IF_ERROR(Fill());
      }
    } else {
      auto* ctx = static_cast<ZSTD_DCtx*>(zstd_);
      if (!member_open_) {
        member_at_ = in_offset_ + static_cast<int64_t>(in_at_);
        member_open_ = true;
      }
      ZSTD_inBuffer ib{in, avail, 0};
      ZSTD_outBuffer ob{out->data() + had, room, 0};
      const size_t hint = ZSTD_decompressStream(ctx, &ob, &ib);
      in_at_ += ib.pos;
      out->resize(had + ob.pos);
      if (ZSTD_isError(hint)) {
        return absl::InvalidArgumentError(absl::StrCat(path_, ": zstd: the frame at byte ", member_at_, " is corrupt (",
                                                       ZstdError(hint), ")"));
      }
      if (hint == 0) {
        member_open_ = false;
      } else if (ib.pos == 0 && ob.pos == 0) {  // it needs more input than is buffered
        if (pos_ >= end_) {
          return absl::InvalidArgumentError(
              absl::StrCat(path_, ": zstd: the frame at byte ", member_at_, " is truncated"));
        }
        SW_RETURN_IF_ERROR(Fill());
      }
    }
  }
  return out->size() - start;
}

absl::StatusOr<std::string> CompressBlock(std::string_view bytes, Compression c, int level) {
  if (bytes.size() > (size_t{1} << 31)) return absl::InvalidArgumentError("compress: a block is at most 2 GiB");
  switch (c) {
    case Compression::kNone: return std::string(bytes);
    case Compression::kGzip: return GzipBlock(bytes, level);
    case Compression::kZstd: return ZstdBlock(bytes, level);
  }
  return std::string(bytes);
}

absl::StatusOr<std::unique_ptr<CompressedFileWriter>> CompressedFileWriter::Open(
    const std::string& path, const CompressedWriterOptions& options) {
  if (options.block_bytes < 4096 || options.block_bytes > (size_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": compressed block size must be in [4096, 2^30], got ", options.block_bytes));
  }
  const int max_level = options.compression == Compression::kZstd ? 19 : 9;
  if (options.level < 0 || options.level > max_level) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", CompressionName(options.compression),
                                                   " level must be in [1, ", max_level, "], got ", options.level));
  }
  std::unique_ptr<CompressedFileWriter> w(new CompressedFileWriter());
  w->options_ = options;
  SW_ASSIGN_OR_RETURN(w->file_, AtomicFile::Open(path, options.sync));
  return w;
}

CompressedFileWriter::~CompressedFileWriter() = default;

absl::Status CompressedFileWriter::Append(std::string_view bytes) {
  bytes_in_ += bytes.size();
  if (options_.compression == Compression::kNone) {
    bytes_out_ += bytes.size();
    return file_->Append(absl::string_view(bytes.data(), bytes.size()));
  }
  while (!bytes.empty()) {
    if (blocks_.empty() || blocks_.back().size() == options_.block_bytes) {
      if (blocks_.size() == static_cast<size_t>(ResolveThreads(options_.threads))) SW_RETURN_IF_ERROR(Flush(false));
      blocks_.emplace_back();
      blocks_.back().reserve(options_.block_bytes);
    }
    std::string& b = blocks_.back();
    const size_t n = std::min(bytes.size(), options_.block_bytes - b.size());
    b.append(bytes.data(), n);
    bytes.remove_prefix(n);
  }
  return absl::OkStatus();
}

absl::Status CompressedFileWriter::Flush(bool all) {
  size_t n = blocks_.size();
  if (!all && n > 0 && blocks_.back().size() < options_.block_bytes) --n;
  std::vector<std::string> out(n);
  SW_RETURN_IF_ERROR(ParallelForStatus(options_.threads, static_cast<int64_t>(n), [&](int64_t i) -> absl::Status {
    SW_ASSIGN_OR_RETURN(out[static_cast<size_t>(i)],
                        CompressBlock(blocks_[static_cast<size_t>(i)], options_.compression, options_.level));
    return absl::OkStatus();
  }));
  for (const std::string& o : out) {
    SW_RETURN_IF_ERROR(file_->Append(absl::string_view(o)));
    bytes_out_ += o.size();
  }
  blocks_.erase(blocks_.begin(), blocks_.begin() + static_cast<std::ptrdiff_t>(n));
  return absl::OkStatus();
}

absl::Status CompressedFileWriter::Commit() {
  // An empty input still makes one (empty) member or frame, as gzip and zstd write.
  if (bytes_in_ == 0 && options_.compression != Compression::kNone) blocks_.emplace_back();
  SW_RETURN_IF_ERROR(Flush(true));
  return file_->Commit();
}

}  // namespace shardwild
