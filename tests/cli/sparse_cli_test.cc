// The sparse-model path through the command line: `data gen` files trained
// by a shipped config (a small variant through --set), the --json summary's
// head metrics, `eval --checkpoint`, `predict` on a Criteo file, bad rows
// under data.on_error, and a checkpoint refused for a config that reads the
// data differently.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_child.h"
#include "core/base/sanitizers.h"
#include "gtest/gtest.h"

namespace shardwild {
namespace {

using namespace clitest;

constexpr char kDlrm[] = SHARDWILD_SOURCE_DIR "/configs/ctr_dlrm.yaml";

class SparseCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    for (const auto& [name, rows, seed] : {std::tuple{"train.tsv", "4000", "1"}, std::tuple{"test.tsv", "1000", "2"}}) {
      const Result r = RunCli({"data", "gen", "--kind", "criteo", "--rows", rows, "--out", Path(name), "--seed", seed});
      ASSERT_EQ(r.code(), 0) << r.err;
    }
  }
  std::string Path(const std::string& name) const { return (dir_.path() / name).string(); }
  // A small DLRM on the generated files.
  std::vector<std::string> Sets() const {
    return {"--set", "data.train=" + Path("train.tsv"), "--set", "data.test=" + Path("test.tsv"),
            "--set", "model.sparse.0.rows=1000",         "--set", "model.bottom.0.units=32",
            "--set", "model.layers.0.units=32",          "--set", "data.cache=false",
            "--set", "train.pin_threads=false"};
  }
  std::vector<std::string> Cmd(std::vector<std::string> head, const std::vector<std::string>& tail = {}) const {
    std::vector<std::string> sets = Sets();
    head.insert(head.end(), sets.begin(), sets.end());
    head.insert(head.end(), tail.begin(), tail.end());
    return head;
  }
  TempDir dir_;
};

TEST_F(SparseCliTest, TrainEvalPredict) {
  const std::string ckpt = Path("ckpt");
  const Result t = RunCli(Cmd({"train", kDlrm, "--json"}, {"--set", "checkpoint.dir=" + ckpt}));
  ASSERT_EQ(t.code(), 0) << t.err;
  const json s = LastLineJson(t.out);
  ASSERT_TRUE(s.is_object()) << t.out;
  // A binary head reports AUC and log-loss besides loss and accuracy.
  for (const char* key : {"test_auc", "test_logloss", "test_loss", "test_accuracy"}) {
    ASSERT_TRUE(s[key].is_number()) << key << ": " << t.out;
  }
  EXPECT_GT(s["test_auc"].get<double>(), 0.55);
  EXPECT_LT(s["test_auc"].get<double>(), 1.0);
  EXPECT_EQ(s["records_seen"], 2 * 4000);
  EXPECT_EQ(s["rows_skipped"]["total"], 0);
  ASSERT_EQ(s["history"].size(), 2u);
  EXPECT_TRUE(s["history"][1]["test_auc"].is_number());
  EXPECT_NE(t.out.find(" auc 0."), std::string::npos) << t.out;  // on the epoch line too

  // The checkpoint evaluates to the same metrics, bit for bit (`eval` merges
  // the same data.records_per_task chunks in the same order as inline
  // evaluation's tasks).
  const Result e = RunCli(Cmd({"eval", kDlrm, "--checkpoint", ckpt, "--json"}));
  ASSERT_EQ(e.code(), 0) << e.err;
  const json ej = LastLineJson(e.out);
  ASSERT_TRUE(ej.is_object()) << e.out;
  EXPECT_EQ(ej["records"], 1000);
  EXPECT_EQ(ej["test_auc"].get<double>(), s["test_auc"].get<double>());
  EXPECT_EQ(ej["test_logloss"].get<double>(), s["test_logloss"].get<double>());
  EXPECT_EQ(ej["test_loss"].get<double>(), s["test_loss"].get<double>());

  // predict: one line per record of a Criteo file, in order, with P(label 1).
  const std::string out = Path("pred.csv");
  const Result p = RunCli(Cmd({"predict", kDlrm, "--checkpoint", ckpt, "--input", Path("test.tsv"), "--out", out}));
  ASSERT_EQ(p.code(), 0) << p.err;
  const std::vector<std::string> lines = Lines(ReadFile(out));
  ASSERT_EQ(lines.size(), 1001u);
  EXPECT_EQ(lines[0], "index,prediction,p1");
  for (size_t i = 1; i < lines.size(); ++i) {
    ASSERT_EQ(lines[i].rfind(std::to_string(i - 1) + ",", 0), 0u) << lines[i];
    const double prob = std::stod(lines[i].substr(lines[i].rfind(',') + 1));
    EXPECT_GT(prob, 0.0);
    EXPECT_LT(prob, 1.0);
  }

  // The checkpoint records how the data was read: another transform is refused.
  const Result bad = RunCli(Cmd({"eval", kDlrm, "--checkpoint", ckpt}, {"--set", "data.dense_transform=log3"}));
  ExpectOneErrorLine(bad, {"trained on data read as", "log1p", "log3"});
}

// bf16 tables (model.sparse[i].dtype) with bf16 compute: they train, hold
// half the parameter bytes, and checkpoint as f32: the run resumes with f32
// tables, and an f32 checkpoint evaluates through bf16 tables. A bad dtype
// is one error line naming the key.
TEST_F(SparseCliTest, Bf16TablesTrainHalveTheirBytesAndCheckpointAsF32) {
  const std::string ckpt = Path("ckpt16");
  const std::vector<std::string> bf16 = {"--set", "model.sparse.0.dtype=bf16", "--set", "checkpoint.dir=" + ckpt};
  const Result f = RunCli(Cmd({"train", kDlrm, "--json"}, {"--set", "train.epochs=1"}));
  ASSERT_EQ(f.code(), 0) << f.err;
  const Result t = RunCli(Cmd({"train", kDlrm, "--json"}, bf16));
  ASSERT_EQ(t.code(), 0) << t.err;
  const json fj = LastLineJson(f.out), tj = LastLineJson(t.out);
  ASSERT_TRUE(fj.is_object() && tj.is_object()) << f.out << t.out;
  EXPECT_GT(tj["test_auc"].get<double>(), 0.55) << tj.dump();
  uint64_t f_params = 0, t_params = 0;
  for (const json& table : fj["store"]["memory"]["tables"]) f_params += table["params_bytes"].get<uint64_t>();
  for (const json& table : tj["store"]["memory"]["tables"]) {
    t_params += table["params_bytes"].get<uint64_t>();
    EXPECT_EQ(table["dtype"], "bf16") << table.dump();
  }
  for (const json& table : fj["store"]["memory"]["tables"]) EXPECT_EQ(table["dtype"], "f32") << table.dump();
  EXPECT_EQ(t_params * 2, f_params) << tj["store"].dump();
  // What checkpoints cost: none written or restored without checkpoint.dir;
  // the bf16 run wrote its final one and restored none.
  EXPECT_EQ(fj["checkpoint_write_s"], 0.0) << fj.dump();
  EXPECT_TRUE(fj["checkpoint_restore_s"].is_null()) << fj.dump();
  EXPECT_GT(tj["checkpoint_write_s"].get<double>(), 0.0) << tj.dump();
  EXPECT_TRUE(tj["checkpoint_restore_s"].is_null()) << tj.dump();

  // Resume as f32 tables for a third epoch.
  const Result r = RunCli(Cmd({"train", kDlrm, "--json"}, {"--set", "checkpoint.dir=" + ckpt, "--set", "train.epochs=3"}));
  ASSERT_EQ(r.code(), 0) << r.err;
  const json rj = LastLineJson(r.out);
  EXPECT_EQ(rj["resumed_from_step"], tj["steps"]) << rj.dump();
  ASSERT_TRUE(rj["checkpoint_restore_s"].is_number()) << rj.dump();
  EXPECT_GT(rj["checkpoint_restore_s"].get<double>(), 0.0);
  EXPECT_GT(rj["checkpoint_write_s"].get<double>(), 0.0);
  EXPECT_GT(rj["test_auc"].get<double>(), 0.55);
  // The f32 checkpoint of that run, evaluated with bf16 tables: the rows
  // rounded to bf16 give nearly the same AUC.
  const Result e = RunCli(Cmd({"eval", kDlrm, "--checkpoint", ckpt, "--json"}, {"--set", "model.sparse.0.dtype=bf16"}));
  ASSERT_EQ(e.code(), 0) << e.err;
  const json ej = LastLineJson(e.out);
  EXPECT_NEAR(ej["test_auc"].get<double>(), rj["test_auc"].get<double>(), 0.01) << ej.dump();

  ExpectOneErrorLine(RunCli(Cmd({"train", kDlrm}, {"--set", "model.sparse.0.dtype=fp8"})),
                     {"model.sparse[0].dtype", "f32", "bf16", "'fp8'"});
}

TEST_F(SparseCliTest, BadRowsFailWithFileLineColumnOrAreSkippedAndCounted) {
  // Line 3 gets a bad hex in C2 (field 16, after the label and 13 I fields and C1).
  std::string text = ReadFile(Path("train.tsv"));
  size_t line3 = 0;
  for (int i = 0; i < 2; ++i) line3 = text.find('\n', line3) + 1;
  size_t at = line3;
  for (int i = 0; i < 15; ++i) at = text.find('\t', at) + 1;
  const size_t end = text.find('\t', at);
  text.replace(at, end - at, "zz");
  const int64_t column = static_cast<int64_t>(at - line3) + 1;
  {
    std::ofstream f(Path("bad.tsv"), std::ios::binary);
    f << text;
  }
  const Result fail = RunCli(Cmd({"train", kDlrm}, {"--set", "data.train=" + Path("bad.tsv")}));
  ExpectOneErrorLine(fail, {Path("bad.tsv") + ":3:" + std::to_string(column) + ":", "C2", "hex", "'zz'"});

  const Result skip =
      RunCli(Cmd({"train", kDlrm, "--json"}, {"--set", "data.train=" + Path("bad.tsv"), "--set", "data.on_error=skip",
                                             "--set", "train.epochs=1"}));
  ASSERT_EQ(skip.code(), 0) << skip.err;
  const json s = LastLineJson(skip.out);
  ASSERT_TRUE(s.is_object()) << skip.out;
  EXPECT_EQ(s["rows_skipped"]["total"], 1);
  EXPECT_EQ(s["rows_skipped"]["train"]["bad hex"], 1);
  EXPECT_EQ(s["records_seen"], 3999);
}

// `data gen --files --compress` writes the rows of one file into several
// compressed ones; training on their glob sees exactly the one file's data
// (same records; with ps.update sync, the same metrics), and a bad row in a
// compressed file is named by that file and its line, and counted per file
// under skip.
TEST_F(SparseCliTest, GlobOfCompressedFilesTrainsAsTheOneFile) {
  for (const std::string compress : {"gz", "zst"}) {
    const Result g = RunCli({"data", "gen", "--kind", "criteo", "--rows", "4000", "--out", Path("day.tsv"), "--seed",
                             "1", "--files", "3", "--compress", compress, "--json"});
    ASSERT_EQ(g.code(), 0) << g.err;
    const json gj = LastLineJson(g.out);
    ASSERT_EQ(gj["files"].size(), 3u) << g.out;
    EXPECT_EQ(gj["files"][2]["path"], Path("day-00002.tsv." + compress));
    const std::vector<std::string> sync = {"--set", "ps.update=sync", "--set", "train.epochs=1"};
    const Result one = RunCli(Cmd({"train", kDlrm, "--json"}, sync));
    std::vector<std::string> glob = sync;
    glob.insert(glob.end(), {"--set", "data.train=" + Path("day-*.tsv." + compress)});
    const Result many = RunCli(Cmd({"train", kDlrm, "--json"}, glob));
    ASSERT_EQ(one.code(), 0) << one.err;
    ASSERT_EQ(many.code(), 0) << many.err;
    const json a = LastLineJson(one.out), b = LastLineJson(many.out);
    ASSERT_TRUE(a.is_object() && b.is_object()) << one.out << many.out;
    EXPECT_EQ(b["records_seen"], 4000);
    EXPECT_EQ(b["test_auc"], a["test_auc"]) << compress;
    EXPECT_EQ(b["train_loss"], a["train_loss"]) << compress;
  }
  // A bad row in the second (compressed) file.
  std::string text = ReadFile(Path("train.tsv"));
  size_t at = 0;
  for (int i = 0; i < 1500; ++i) at = text.find('\n', at) + 1;  // line 1501 of the file = line 1 of part 2
  const std::string first = text.substr(0, at);
  std::string second = text.substr(at);
  second.replace(second.find('\t'), 0, "x");  // "0x\t..." : a bad label
  for (const auto& [name, part] : {std::pair{"p-1.tsv", first}, std::pair{"p-2.tsv", second}}) {
    std::ofstream f(Path(name), std::ios::binary);
    f << part;
  }
  ASSERT_EQ(std::system(("gzip -f " + Path("p-2.tsv")).c_str()), 0);
  const Result fail = RunCli(Cmd({"train", kDlrm}, {"--set", "data.train=" + Path("p-*.tsv*")}));
  ExpectOneErrorLine(fail, {Path("p-2.tsv.gz") + ":1:1:", "label"});
  const Result skip = RunCli(Cmd({"train", kDlrm, "--json"}, {"--set", "data.train=" + Path("p-1.tsv") + "," +
                                                                          Path("p-2.tsv.gz"),
                                                              "--set", "data.on_error=skip", "--set", "train.epochs=1"}));
  ASSERT_EQ(skip.code(), 0) << skip.err;
  const json s = LastLineJson(skip.out);
  EXPECT_EQ(s["records_seen"], 3999);
  EXPECT_EQ(s["rows_skipped"]["train_files"][Path("p-2.tsv.gz")], 1) << skip.out;
  ExpectOneErrorLine(RunCli(Cmd({"train", kDlrm}, {"--set", "data.train=" + Path("none-*.tsv")})),
                     {"data.train: '" + Path("none-*.tsv") + "' matches no file"});
}

// data.stream: the records come from the columnar cache while training
// runs, every one exactly once per epoch; one worker trains the same model
// twice (the windows' shuffles are seeded), and about as well as from the
// data loaded whole; a second run reads the cache it left.
TEST_F(SparseCliTest, StreamedTrainingIsExactReproducibleAndReusesItsCache) {
  const std::vector<std::string> sets = {"--set", "train.workers=1", "--set", "train.epochs=2", "--set",
                                         "data.records_per_task=700"};
  std::vector<std::string> streamed = sets;
  streamed.insert(streamed.end(), {"--set", "data.stream=true", "--set", "data.shuffle_buffer=300"});
  // (A first run may train while its cache is built, in an order that
  // depends on when the parts are ready; runs from the cache are seeded.)
  const Result a = RunCli(Cmd({"train", kDlrm, "--json"}, streamed));
  const Result b = RunCli(Cmd({"train", kDlrm, "--json"}, streamed));
  const Result c = RunCli(Cmd({"train", kDlrm, "--json"}, streamed));
  const Result whole = RunCli(Cmd({"train", kDlrm, "--json"}, sets));
  for (const Result* r : {&a, &b, &c, &whole}) ASSERT_EQ(r->code(), 0) << r->err;
  const json ja = LastLineJson(a.out), jb = LastLineJson(b.out), jc = LastLineJson(c.out), jw = LastLineJson(whole.out);
  ASSERT_TRUE(ja.is_object() && jb.is_object() && jc.is_object() && jw.is_object()) << a.out << b.out << whole.out;
  EXPECT_EQ(ja["records_seen"], 2 * 4000);
  for (const json& e : ja["history"]) EXPECT_EQ(e["records"], 4000);
  EXPECT_EQ(jb["train_loss"], jc["train_loss"]);
  EXPECT_EQ(jb["test_auc"], jc["test_auc"]);
  EXPECT_NEAR(ja["test_auc"].get<double>(), jw["test_auc"].get<double>(), 0.03) << ja.dump() << jw.dump();
  EXPECT_EQ(ja["data"]["stream"], true);
  EXPECT_EQ(ja["data"]["cache"]["files_built"], 1);
  EXPECT_EQ(jb["data"]["cache"]["files_built"], 0);
  EXPECT_EQ(jb["data"]["cache"]["files_cached"], 1);
  EXPECT_EQ(ja["data"]["records"], 4000);
  EXPECT_TRUE(ja["data_wait_s"].is_number());
  // A window of 300 records rounds up to 384: one item of 3 batches of 128
  // (no longer than the window asked for), 3 more ready for the 8
  // prefetched batches.
  EXPECT_GT(ja["data"]["reader_peak_bytes"].get<int64_t>(), 0);
  EXPECT_LE(ja["data"]["reader_peak_bytes"].get<int64_t>(), ja["data"]["memory_budget_bytes"].get<int64_t>());
  EXPECT_EQ(jw["data"]["stream"], false);
  // Records read whole are packed for the loads; streamed ones are not.
  EXPECT_EQ(jw["data"]["packed"]["ids"], true) << jw["data"].dump();
  EXPECT_EQ(jw["data"]["packed"]["records"], 4000);
  EXPECT_GT(jw["data"]["packed"]["seconds"].get<double>(), 0.0) << jw["data"].dump();  // the time PackRecords took
  EXPECT_EQ(jw["data"]["packed"]["weights"].size(), 0u);  // DLRM's lookups are not weighted
  // Its 26 fields of one id or none and 13 dense values: the one-id layout,
  // 164 bytes a record in 192-byte slots, the dense values in them.
  EXPECT_EQ(jw["data"]["packed"]["one_id_bags"], true) << jw["data"].dump();
  EXPECT_EQ(jw["data"]["packed"]["dense_in_block"], true) << jw["data"].dump();
  EXPECT_EQ(jw["data"]["packed"]["layout"], "slots") << jw["data"].dump();
  EXPECT_EQ(jw["data"]["packed"]["slot_bytes"], 192) << jw["data"].dump();
  EXPECT_EQ(jw["data"]["packed"]["bytes"], 4000 * 192 + 3 * 8) << jw["data"].dump();
  EXPECT_TRUE(ja["data"]["packed"].is_null()) << ja["data"].dump();
  EXPECT_TRUE(std::filesystem::exists(Path("train.tsv.swcols/index.json")));
}

// libsvm features trained by the shipped sparse logistic regression: values
// of 3 decimals are packed in the ids' words (data.packed.weights: coded, 3
// decimals, 20 bits of the 2^20 rows' ids), in 128-byte slots; the same
// data with a value of 7 decimals in every 10th row, which no 6 decimals
// give back, keeps its floats beside the ids, in 256-byte slots. Both
// train. (That a coded load gives back the very floats is model_test's.)
TEST_F(SparseCliTest, LibsvmWeightsOfFewDecimalsArePackedInTheIdsWords) {
  constexpr char kLogreg[] = SHARDWILD_SOURCE_DIR "/configs/sparse_logreg.yaml";
  for (const auto& [name, rows, seed] : {std::tuple{"train.svm", "3000", "1"}, std::tuple{"test.svm", "500", "2"}}) {
    const Result r = RunCli({"data", "gen", "--kind", "libsvm", "--rows", rows, "--out", Path(name), "--seed", seed});
    ASSERT_EQ(r.code(), 0) << r.err;
  }
  // The same values with a 7th decimal in every 10th row's first value (a
  // float no 6 decimals give back): those rows' other values unchanged.
  {
    std::ifstream in(Path("train.svm"));
    std::ofstream out(Path("train7.svm"));
    std::string line;
    for (int i = 0; std::getline(in, line); ++i) {
      if (i % 10 == 0) {
        const size_t colon = line.find(':');
        const size_t end = line.find_first_of(" \n", colon);
        if (colon != std::string::npos) line.insert(end == std::string::npos ? line.size() : end, "0001");
      }
      out << line << "\n";
    }
  }
  auto train = [&](const std::string& file) {
    const Result r = RunCli({"train", kLogreg, "--json", "--set", "data.train=" + Path(file), "--set",
                             "data.test=" + Path("test.svm"), "--set", "train.workers=1", "--set", "train.epochs=1",
                             "--set", "data.cache=false", "--set", "train.pin_threads=false"});
    EXPECT_EQ(r.code(), 0) << r.err;
    return LastLineJson(r.out);
  };
  const json coded = train("train.svm"), floats = train("train7.svm");
  ASSERT_TRUE(coded.is_object() && floats.is_object());
  const json& cp = coded["data"]["packed"];
  EXPECT_EQ(cp["layout"], "slots") << cp.dump();
  EXPECT_EQ(cp["slot_bytes"], 128) << cp.dump();
  ASSERT_EQ(cp["weights"].size(), 1u) << cp.dump();
  EXPECT_EQ(cp["weights"][0]["field"], "features");
  EXPECT_EQ(cp["weights"][0]["coded"], true);
  EXPECT_EQ(cp["weights"][0]["decimals"], 3);
  EXPECT_EQ(cp["weights"][0]["id_bits"], 20);
  const json& fp = floats["data"]["packed"];
  ASSERT_EQ(fp["weights"].size(), 1u) << fp.dump();
  EXPECT_EQ(fp["weights"][0]["coded"], false);
  EXPECT_FALSE(fp["weights"][0].contains("decimals"));
  EXPECT_EQ(fp["slot_bytes"], 256) << fp.dump();
  EXPECT_GT(fp["bytes"].get<int64_t>(), cp["bytes"].get<int64_t>());
  // Both learn (the data's planted model).
  EXPECT_GT(coded["test_auc"].get<double>(), 0.6) << coded.dump();
  EXPECT_GT(floats["test_auc"].get<double>(), 0.6) << floats.dump();
}

// What streaming can't do, and a bad row in streamed data: one error line each.
TEST_F(SparseCliTest, StreamedDataErrors) {
  // `bench` refuses streamed data before it sets anything up (no cache is built).
  ExpectOneErrorLine(RunCli(Cmd({"bench", kDlrm}, {"--set", "data.stream=true"})),
                     {"data.stream", "`shardwild bench` times steps over records held in memory"});
  EXPECT_FALSE(std::filesystem::exists(Path("train.tsv.swcols")));
  ExpectOneErrorLine(RunCli(Cmd({"train", kDlrm}, {"--set", "data.stream=true", "--set", "data.shuffle_buffer=100000",
                                                  "--set", "data.records_per_task=100000", "--set",
                                                  "data.memory_budget_mb=8"})),
                     {"data.shuffle_buffer", "data.memory_budget_mb 8 shared by 2 readers is 4.0 MiB each",
                      "lower data.shuffle_buffer"});
  ExpectOneErrorLine(RunCli(Cmd({"train", kDlrm}, {"--set", "data.stream=true", "--set", "ps.update=sync"})),
                     {"data.stream", "use ps.update hogwild or row_lock"});
  std::string text = ReadFile(Path("train.tsv"));
  size_t at = 0;
  for (int i = 0; i < 2999; ++i) at = text.find('\n', at) + 1;
  text.insert(text.find('\t', at) + 1, "q");
  {
    std::ofstream f(Path("bad.tsv"), std::ios::binary);
    f << text;
  }
  ExpectOneErrorLine(RunCli(Cmd({"train", kDlrm}, {"--set", "data.stream=true", "--set", "data.train=" + Path("bad.tsv")})),
                     {Path("bad.tsv") + ":3000:", "'q"});
}

// A first run trains while its cache is built (data.cache_part_mb parts,
// each readable once it and those before it are built): the counts are
// exact, the summary says when the first task went out, and a bad row in a
// late part still fails the run with its file:line:column once training
// has started on the parts before it.
TEST_F(SparseCliTest, ColdStreamedRunTrainsWhileItsCacheIsBuilt) {
  const Result g = RunCli({"data", "gen", "--kind", "criteo", "--rows", "24000", "--out", Path("cold.tsv")});
  ASSERT_EQ(g.code(), 0) << g.err;
  const std::vector<std::string> sets = {"--set", "data.train=" + Path("cold.tsv"), "--set", "data.stream=true",
                                         "--set", "data.cache_part_mb=1",          "--set", "data.reader_threads=1",
                                         "--set", "train.epochs=2",                "--set", "data.records_per_task=1000"};
  const Result cold = RunCli(Cmd({"train", kDlrm, "--json"}, sets));
  ASSERT_EQ(cold.code(), 0) << cold.err;
  const json j = LastLineJson(cold.out);
  ASSERT_TRUE(j.is_object()) << cold.out;
  EXPECT_EQ(j["records_seen"], 2 * 24000);
  for (const json& e : j["history"]) EXPECT_EQ(e["records"], 24000);
  EXPECT_EQ(j["data"]["records"], 24000);
  EXPECT_EQ(j["data"]["cache"]["files_built"], 1);
  EXPECT_GE(j["data"]["cache"]["parts"].get<int>(), 3);
  EXPECT_GE(j["data"]["first_task_after_ready_s"].get<double>(), 0);
  // (Fewer than all of them when the first task beat the build, as it
  // does on this machine; how many depends on the machine's speed.)
  EXPECT_GT(j["data"]["records_ready_at_first_task"].get<int64_t>(), 0);
  EXPECT_LE(j["data"]["records_ready_at_first_task"].get<int64_t>(), 24000);
  EXPECT_GT(j["test_auc"].get<double>(), 0.6);

  std::string text = ReadFile(Path("cold.tsv"));
  size_t at = 0;
  for (int i = 0; i < 23000; ++i) at = text.find('\n', at) + 1;
  text.insert(text.find('\t', at) + 1, "q");  // line 23001, in the last part
  {
    std::ofstream f(Path("cold_bad.tsv"), std::ios::binary);
    f << text;
  }
  std::vector<std::string> bad = sets;
  bad.insert(bad.end(), {"--set", "data.train=" + Path("cold_bad.tsv")});
  ExpectOneErrorLine(RunCli(Cmd({"train", kDlrm}, bad)), {Path("cold_bad.tsv") + ":23001:", "'q"});
  EXPECT_FALSE(std::filesystem::exists(Path("cold_bad.tsv.swcols")));
  ExpectOneErrorLine(RunCli(Cmd({"train", kDlrm}, {"--set", "data.cache_part_mb=0"})), {"data.cache_part_mb", "must be 1..1048576, got 0"});
}

// A cache larger than the memory the process may have (RLIMIT_DATA, set by
// prlimit, 256 MiB; the cache of 600k rows is about 270 MiB): the data set
// loaded whole does not fit, streamed it trains with exact counts (the page
// cache holds the data, not the process).
TEST_F(SparseCliTest, StreamedFromACacheLargerThanTheProcessMemoryLimit) {
#ifdef SHARDWILD_SANITIZED
  GTEST_SKIP() << "sanitizer runtimes reserve more address space than the limit this test sets";
#endif
  if (!std::filesystem::exists("/usr/bin/prlimit")) GTEST_SKIP() << "prlimit (util-linux) is not installed";
  const Result g = RunCli({"data", "gen", "--kind", "criteo", "--rows", "600000", "--out", Path("big.tsv"), "--files",
                           "3", "--compress", "gz"});
  ASSERT_EQ(g.code(), 0) << g.err;
  const std::vector<std::string> sets = {
      "--set", "data.train=" + Path("big-*.tsv.gz"), "--set", "train.epochs=1", "--set", "data.records_per_task=20000",
      "--set", "model.sparse.0.rows=1000", "--set", "model.bottom.0.units=16", "--set", "model.bottom.1.units=16",
      "--set", "model.layers.0.units=16", "--set", "model.layers.1.units=16", "--set", "train.batch_size=512"};
  // (The process itself, its libraries, threads and model, takes about 100 MiB of it.)
  constexpr int64_t kLimit = int64_t{256} << 20;
  const std::vector<std::string> limit = {"/usr/bin/prlimit", "--data=" + std::to_string(kLimit), "--"};
  std::vector<std::string> stream_args = {"train", kDlrm, "--json", "--set", "data.stream=true", "--set",
                                          "data.memory_budget_mb=16"};
  for (const std::string& s : Sets()) stream_args.push_back(s);
  stream_args.insert(stream_args.end(), sets.begin(), sets.end());
  Child streamed(stream_args, limit);
  ASSERT_TRUE(streamed.started());
  const int status = streamed.Wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << streamed.out() << streamed.err();
  const json j = LastLineJson(streamed.out());
  ASSERT_TRUE(j.is_object()) << streamed.out();
  EXPECT_EQ(j["records_seen"], 600000);
  EXPECT_GT(j["data"]["cache"]["bytes"].get<int64_t>(), kLimit) << "the cache must be larger than the limit";
  // The same data loaded whole does not fit under the limit.
  std::vector<std::string> whole_args = {"train", kDlrm};
  for (const std::string& s : Sets()) whole_args.push_back(s);
  whole_args.insert(whole_args.end(), sets.begin(), sets.end());
  Child whole(whole_args, limit);
  ASSERT_TRUE(whole.started());
  const int whole_status = whole.Wait();
  EXPECT_FALSE(WIFEXITED(whole_status) && WEXITSTATUS(whole_status) == 0) << "loaded whole, it fit after all";
}

// Worker processes attach to the store's tables and read the data themselves.
// Worker processes train the tables and evaluate the binary head in
// evaluation tasks: each task's AUC pairs travel to the main process, and
// the merged metrics equal `eval` of the final checkpoint exactly.
TEST_F(SparseCliTest, WorkerProcessesTrainTablesToo) {
  const std::string ckpt = Path("ckpt-processes");
  const std::vector<std::string> sets = {"--set", "data.records_per_task=300"};
  std::vector<std::string> train_sets = {"--set", "train.worker_processes=true", "--set", "checkpoint.dir=" + ckpt};
  train_sets.insert(train_sets.end(), sets.begin(), sets.end());
  const Result t = RunCli(Cmd({"train", kDlrm, "--json"}, train_sets));
  ASSERT_EQ(t.code(), 0) << t.err;
  const json s = LastLineJson(t.out);
  ASSERT_TRUE(s.is_object()) << t.out;
  EXPECT_EQ(s["records_seen"], 2 * 4000);
  EXPECT_EQ(s["eval_records_seen"], 2 * 1000);
  EXPECT_EQ(s["worker_failures"], 0);
  ASSERT_TRUE(s["test_auc"].is_number()) << t.out;
  EXPECT_GT(s["test_auc"].get<double>(), 0.55);
  const Result e = RunCli(Cmd({"eval", kDlrm, "--checkpoint", ckpt, "--json"}, sets));
  ASSERT_EQ(e.code(), 0) << e.err;
  const json ej = LastLineJson(e.out);
  ASSERT_TRUE(ej.is_object()) << e.out;
  EXPECT_EQ(ej["test_auc"].get<double>(), s["test_auc"].get<double>());
  EXPECT_EQ(ej["test_logloss"].get<double>(), s["test_logloss"].get<double>());
  EXPECT_EQ(ej["test_loss"].get<double>(), s["test_loss"].get<double>());
}

}  // namespace
}  // namespace shardwild
