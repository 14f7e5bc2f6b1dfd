// Tests of heatmap rendering (tools/lib/heatmap.h) and of `cpuattn heatmap` (the built binary,
// CPUATTN_CLI_PATH, run in a temporary directory). PNGs are read back with libpng.
#include <dirent.h>
#include <gtest/gtest.h>
#include <png.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "cli_test_util.h"
#include "heatmap.h"
#include "npy.h"

#ifndef CPUATTN_CLI_PATH
#error "CPUATTN_CLI_PATH must be defined to the path of the cpuattn binary"
#endif

namespace hm = cpuattn::heatmap;
namespace npy = cpuattn::npy;
using cpuattn::DType;
using cpuattn::cli_test::exists;
using cpuattn::cli_test::Result;
using cpuattn::cli_test::slurp;

namespace {

const hm::Rgb kBottom{0x44, 0x01, 0x54};  // viridis(0), #440154
const hm::Rgb kTop{0xfd, 0xe7, 0x25};     // viridis(1), #fde725

std::string str(hm::Rgb c) { return hm::hex(c); }

std::size_t count(const std::string& haystack, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

// Decodes a PNG with libpng's simplified API; expects 8-bit RGB without alpha.
hm::Image decode_png(const void* bytes, std::size_t size) {
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&png, bytes, size)) {
    ADD_FAILURE() << "libpng cannot read the PNG: " << png.message;
    return {};
  }
  // The file's own format: colour, no alpha, not 16-bit (PNG_FORMAT_FLAG_LINEAR).
  EXPECT_EQ(png.format, static_cast<png_uint_32>(PNG_FORMAT_RGB)) << "not 8-bit RGB";
  png.format = PNG_FORMAT_RGB;
  hm::Image img;
  img.width = static_cast<int>(png.width);
  img.height = static_cast<int>(png.height);
  img.rgb.resize(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, img.rgb.data(), 0, nullptr)) {
    ADD_FAILURE() << "libpng cannot decode the PNG: " << png.message;
    return {};
  }
  return img;
}
hm::Image decode_png(const std::vector<unsigned char>& bytes) {
  return decode_png(bytes.data(), bytes.size());
}
hm::Image read_png(const std::string& path) {
  const std::string bytes = slurp(path);
  EXPECT_FALSE(bytes.empty()) << path;
  return decode_png(bytes.data(), bytes.size());
}

// Whether every pixel of cell (r, c) has colour `want`.
// A cell outside the image is a failure, not a read past its pixels (an image that failed to
// decode is empty).
::testing::AssertionResult cell_is(const hm::Image& img, int cell, int r, int c, hm::Rgb want) {
  if ((c + 1) * cell > img.width || (r + 1) * cell > img.height ||
      img.rgb.size() != static_cast<std::size_t>(img.width) * img.height * 3) {
    return ::testing::AssertionFailure()
           << "cell (" << r << ", " << c << ") of " << cell << " pixels is outside the "
           << img.width << " x " << img.height << " image";
  }
  for (int y = r * cell; y < (r + 1) * cell; ++y) {
    for (int x = c * cell; x < (c + 1) * cell; ++x) {
      if (!(img.at(x, y) == want)) {
        return ::testing::AssertionFailure()
               << "cell (" << r << ", " << c << ") pixel (" << x << ", " << y << ") is "
               << str(img.at(x, y)) << ", expected " << str(want);
      }
    }
  }
  return ::testing::AssertionSuccess();
}

hm::Matrix matrix(std::int64_t rows, std::int64_t cols, std::vector<float> v) {
  hm::Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.values = std::move(v);
  return m;
}

// ---- Colour map ----------------------------------------------------------------------------

TEST(Viridis, EndsAndKnownEntries) {
  EXPECT_EQ(hm::viridis(0), kBottom);
  EXPECT_EQ(hm::viridis(1), kTop);
  EXPECT_EQ(hm::viridis(-3), kBottom);
  EXPECT_EQ(hm::viridis(7), kTop);
  EXPECT_EQ(hm::viridis(std::nan("")), kBottom);
  EXPECT_EQ(hm::viridis_anchors().front(), kBottom);
  EXPECT_EQ(hm::viridis_anchors().back(), kTop);
  EXPECT_GE(hm::viridis_anchors().size(), 16u);
  // Entries 64, 128 and 192 of matplotlib's 256-entry table, to within the interpolation error.
  const struct {
    int index;
    hm::Rgb rgb;
  } known[] = {{64, {0x3b, 0x52, 0x8b}}, {128, {0x21, 0x91, 0x8c}}, {192, {0x5e, 0xc9, 0x62}}};
  for (const auto& k : known) {
    const hm::Rgb got = hm::viridis(k.index / 255.0);
    EXPECT_LE(std::abs(got.r - k.rgb.r), 7) << k.index << ": " << str(got);
    EXPECT_LE(std::abs(got.g - k.rgb.g), 7) << k.index << ": " << str(got);
    EXPECT_LE(std::abs(got.b - k.rgb.b), 7) << k.index << ": " << str(got);
  }
}

TEST(Viridis, LightnessIncreases) {
  // Perceptually uniform maps are monotone in lightness; approximate it by luma.
  double prev = -1;
  for (int i = 0; i <= 100; ++i) {
    const hm::Rgb c = hm::viridis(i / 100.0);
    const double luma = 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b;
    EXPECT_GT(luma, prev) << "at " << i / 100.0;
    prev = luma;
  }
}

TEST(Viridis, ColourOf) {
  EXPECT_EQ(hm::colour_of(0.5f, 0.5f), kTop);
  EXPECT_EQ(hm::colour_of(0.0f, 0.5f), kBottom);
  EXPECT_EQ(hm::colour_of(-1.0f, 0.5f), kBottom);
  EXPECT_EQ(hm::colour_of(std::numeric_limits<float>::infinity(), 0.5f), kTop);
  EXPECT_EQ(hm::colour_of(std::nanf(""), 0.5f), hm::kNanColour);
  EXPECT_EQ(hm::colour_of(0.25f, 0.5f), hm::viridis(0.5));
  // The NaN colour is not on the map.
  for (int i = 0; i <= 255; ++i) EXPECT_FALSE(hm::viridis(i / 255.0) == hm::kNanColour);
}

TEST(Viridis, ScaleMax) {
  EXPECT_EQ(hm::scale_max(matrix(1, 3, {0.1f, 0.7f, 0.3f})), 0.7f);
  EXPECT_EQ(hm::scale_max(matrix(1, 3, {0.1f, std::nanf(""), 0.3f})), 0.3f);
  EXPECT_EQ(hm::scale_max(matrix(1, 2, {0.2f, std::numeric_limits<float>::infinity()})), 0.2f);
  EXPECT_EQ(hm::scale_max(matrix(1, 2, {0, 0})), 1.0f);  // nothing > 0: scale 0..1
}

// ---- PNG rendering -------------------------------------------------------------------------

TEST(Render, KnownMatrix) {
  // 3 x 4, max 0.8 at (1, 2), zeros at (0, 0) and (2, 3), a NaN at (2, 0).
  const float nan = std::nanf("");
  const hm::Matrix m =
      matrix(3, 4, {0.0f, 0.2f, 0.4f, 0.1f, 0.3f, 0.1f, 0.8f, 0.6f, nan, 0.5f, 0.4f, 0.0f});
  hm::Options o;
  o.cell = 10;
  const hm::Layout l = hm::layout(3, 4, o);
  const hm::Image img = decode_png(hm::encode_png(hm::render(m, o)));
  ASSERT_EQ(img.width, l.width);
  ASSERT_EQ(img.height, l.height);
  EXPECT_EQ(l.grid_width, 40);
  EXPECT_EQ(l.grid_height, 30);
  EXPECT_GE(l.bar_x, 40 + 4);  // a gap of at least 4 px
  EXPECT_GE(l.bar_width, 8);
  EXPECT_EQ(img.width, l.bar_x + l.bar_width);
  EXPECT_EQ(img.height, hm::kMinBarHeight);  // 30 px of grid; the bar is taller

  // Every cell is uniform and has its value's colour.
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 4; ++c) {
      EXPECT_TRUE(cell_is(img, 10, r, c, hm::colour_of(m.at(r, c), 0.8f)));
    }
  }
  EXPECT_TRUE(cell_is(img, 10, 1, 2, kTop));     // the max
  EXPECT_TRUE(cell_is(img, 10, 0, 0, kBottom));  // zeros
  EXPECT_TRUE(cell_is(img, 10, 2, 3, kBottom));
  EXPECT_TRUE(cell_is(img, 10, 2, 0, hm::kNanColour));
  EXPECT_EQ(img.at(15, 5), hm::viridis(0.25));  // 0.2 of 0.8

  // Below the grid and in the gap: background.
  EXPECT_EQ(img.at(0, 30), hm::kBackground);
  EXPECT_EQ(img.at(39, img.height - 1), hm::kBackground);
  for (int x = 40; x < l.bar_x; ++x) {
    for (int y = 0; y < img.height; ++y) ASSERT_EQ(img.at(x, y), hm::kBackground) << x << "," << y;
  }
  // The colour bar: top colour at the top, bottom colour at the bottom, uniform across, and
  // going down the map from top to bottom.
  for (int x = l.bar_x; x < img.width; ++x) {
    EXPECT_EQ(img.at(x, 0), kTop);
    EXPECT_EQ(img.at(x, img.height - 1), kBottom);
    for (int y = 0; y < img.height; ++y) ASSERT_EQ(img.at(x, y), img.at(l.bar_x, y));
  }
  EXPECT_EQ(img.at(l.bar_x, (img.height - 1) / 2), hm::viridis(1.0 - 31.0 / 63));
}

TEST(Render, PngRoundTripIsExact) {
  std::vector<float> v(7 * 9);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i)) * 0.5f + 0.5f;
  const hm::Image img = hm::render(matrix(7, 9, v), {});
  const hm::Image back = decode_png(hm::encode_png(img));
  EXPECT_EQ(back.width, img.width);
  EXPECT_EQ(back.height, img.height);
  EXPECT_EQ(back.rgb, img.rgb);
}

TEST(Render, AutoCell) {
  EXPECT_EQ(hm::auto_cell(15, 14), 42);
  EXPECT_EQ(hm::auto_cell(2, 2), hm::kAutoCellCap);
  EXPECT_EQ(hm::auto_cell(1, 1), hm::kAutoCellCap);
  EXPECT_EQ(hm::auto_cell(1000, 10), 1);
  EXPECT_EQ(hm::auto_cell(10, 5000), 1);
  for (std::int64_t n : {10, 16, 33, 64, 100, 257, 640}) {
    const hm::Layout l = hm::layout(n, n, {});
    EXPECT_GE(l.width, 400) << n;
    EXPECT_LE(l.width, 800) << n;
  }
}

TEST(Render, Limits) {
  EXPECT_THROW(hm::layout(0, 3, {}), hm::Error);
  hm::Options o;
  o.cell = hm::kMaxCell + 1;
  EXPECT_THROW(hm::layout(3, 3, o), hm::Error);
  o.cell = -1;
  EXPECT_THROW(hm::layout(3, 3, o), hm::Error);
  o.cell = 100;
  EXPECT_THROW(hm::layout(20000, 20000, o), hm::Error);
  EXPECT_THROW(hm::layout(1, std::int64_t{1} << 40, {}), hm::Error);
  EXPECT_THROW(hm::layout(std::int64_t{1} << 62, std::int64_t{1} << 62, o), hm::Error);
  EXPECT_THROW(hm::render(matrix(2, 2, {1, 2, 3}), {}), hm::Error);
  EXPECT_NO_THROW(hm::layout(4000, 4000, {}));
}

// ---- SVG -----------------------------------------------------------------------------------

TEST(Svg, XmlEscape) {
  EXPECT_EQ(hm::xml_escape("a&b<c>d\"e'f"), "a&amp;b&lt;c&gt;d&quot;e&apos;f");
  EXPECT_EQ(hm::xml_escape("&amp;"), "&amp;amp;");
  EXPECT_EQ(hm::xml_escape("août économique"), "août économique");
  EXPECT_EQ(hm::xml_escape(""), "");
}

TEST(Svg, LabelsCellsAndTicks) {
  const std::vector<std::string> rows = {"L'", "<end>", "a & b"};
  const std::vector<std::string> cols = {"\"quoted\"", "x>y", "été", "plain"};
  const hm::Matrix m = matrix(
      3, 4, {0.0f, 0.2f, 0.4f, 0.1f, 0.3f, 0.1f, 0.8f, 0.6f, std::nanf(""), 0.5f, 0.4f, 0.0f});
  const std::string svg = hm::render_svg(m, rows, cols, {}, "weights <w.npy>");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find("<title>weights &lt;w.npy&gt;</title>"), std::string::npos);
  // Every label, escaped, as a <text>; the raw forms never appear.
  for (const char* escaped :
       {">L&apos;</text>", ">&lt;end&gt;</text>", ">a &amp; b</text>", ">&quot;quoted&quot;</text>",
        ">x&gt;y</text>", ">été</text>", ">plain</text>"}) {
    EXPECT_EQ(count(svg, escaped), 1u) << escaped;
  }
  EXPECT_EQ(svg.find("<end>"), std::string::npos);
  EXPECT_EQ(svg.find("\"quoted\""), std::string::npos);
  EXPECT_EQ(svg.find("a & b"), std::string::npos);
  EXPECT_EQ(svg.find("L'"), std::string::npos);
  // Column labels rotated.
  EXPECT_EQ(count(svg, "transform=\"rotate(-60 "), 4u);
  // One rect per cell with its colour; the max is the top colour, zeros the bottom, NaN red.
  EXPECT_EQ(count(svg, "<rect x="), 12u + 2u);  // cells + colour bar + NaN legend
  EXPECT_EQ(count(svg, "fill=\"" + str(kTop) + "\"><title>"), 1u);
  EXPECT_EQ(count(svg, "fill=\"" + str(kBottom) + "\"><title>"), 2u);
  EXPECT_EQ(count(svg, "fill=\"#ff0000\"><title>"), 1u);
  EXPECT_NE(svg.find("<title>&lt;end&gt; \u2192 été: 0.8</title>"), std::string::npos);
  // Colour bar with ticks 0, max/2, max.
  EXPECT_NE(svg.find("fill=\"url(#colour-scale)\""), std::string::npos);
  EXPECT_EQ(count(svg, "<stop "), hm::viridis_anchors().size());
  for (const char* tick : {">0</text>", ">0.4</text>", ">0.8</text>", ">NaN</text>"}) {
    EXPECT_EQ(count(svg, tick), 1u) << tick;
  }
}

TEST(Svg, MissingAxisIsNumbered) {
  const std::string svg = hm::render_svg(matrix(2, 3, {1, 0, 0, 0, 1, 0}), {"a", "b"}, {});
  for (const char* t : {">a</text>", ">b</text>", ">0</text>", ">1</text>", ">2</text>"}) {
    EXPECT_GE(count(svg, t), 1u) << t;
  }
  EXPECT_EQ(svg.find(">NaN</text>"), std::string::npos);
  EXPECT_THROW(hm::render_svg(matrix(2, 3, {1, 0, 0, 0, 1, 0}), {"a"}, {}), hm::Error);
  EXPECT_THROW(hm::render_svg(matrix(2, 3, {1, 0, 0, 0, 1, 0}), {}, {"a", "b"}), hm::Error);
}

// The SVG is well-formed XML (checked with Python's parser when /usr/bin/python3 exists).
TEST(Svg, WellFormed) {
  if (!exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  const std::string path = ::testing::TempDir() + "cpuattn_heatmap_wellformed.svg";
  hm::write_file(path,
                 hm::render_svg(matrix(2, 2, {0.5f, 0.5f, 1, 0}), {"<&>\"'", "été"}, {"]]>", "x"}));
  const int status =
      std::system(("/usr/bin/python3 -c 'import sys, xml.dom.minidom as m; "
                   "d = m.parse(sys.argv[1]); assert d.documentElement.tagName == \"svg\"' '" +
                   path + "'")
                      .c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "not well-formed: " << path;
  std::remove(path.c_str());
}

// ---- Labels and paths ----------------------------------------------------------------------

TEST(Labels, Parse) {
  using V = std::vector<std::string>;
  EXPECT_EQ(hm::parse_labels("a\nb\n"), (V{"a", "b"}));
  EXPECT_EQ(hm::parse_labels("a\nb"), (V{"a", "b"}));
  EXPECT_EQ(hm::parse_labels("a\r\nb\r\n"), (V{"a", "b"}));
  EXPECT_EQ(hm::parse_labels("\xEF\xBB\xBF"
                             "a\n"),
            (V{"a"}));
  EXPECT_EQ(hm::parse_labels("a\n\nc\n"), (V{"a", "", "c"}));
  EXPECT_EQ(hm::parse_labels("  spaced  \n\ttab\n"), (V{"  spaced  ", "\ttab"}));
  EXPECT_EQ(hm::parse_labels("août\n€\n𝄞\n"), (V{"août", "€", "𝄞"}));
  EXPECT_EQ(hm::parse_labels(""), V{});
  EXPECT_EQ(hm::parse_labels("\n"), V{""});
}

TEST(Labels, Rejects) {
  for (const char* bad :
       {"ok\n\xff\n", "\xc3\n", "\xc0\xaf\n", "\xed\xa0\x80\n", "\xf4\x90\x80\x80\n",
        "a\x01"
        "b\n",
        "\x7f\n"}) {
    try {
      hm::parse_labels(bad);
      ADD_FAILURE() << "accepted " << ::testing::PrintToString(std::string(bad));
    } catch (const hm::Error& e) {
      EXPECT_NE(std::string(e.what()).find("line "), std::string::npos) << e.what();
    }
  }
  try {
    hm::parse_labels("fine\n\xff\n");
  } catch (const hm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2 is not valid UTF-8"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(hm::read_labels("/nonexistent/labels.txt"), hm::Error);
}

TEST(Paths, SvgPathFor) {
  EXPECT_EQ(hm::svg_path_for("heat.png"), "heat.svg");
  EXPECT_EQ(hm::svg_path_for("docs/heat.map.png"), "docs/heat.map.svg");
  EXPECT_EQ(hm::svg_path_for("a.b/heat"), "a.b/heat.svg");
  EXPECT_EQ(hm::svg_path_for(".hidden"), ".hidden.svg");
  EXPECT_EQ(hm::svg_path_for("heat.svg"), "heat.svg");
}

// ---- The command ---------------------------------------------------------------------------

// The CLI fixture of test_cli (temporary directory, put, run) plus heatmap helpers.
class HeatmapCli : public cpuattn::cli_test::CliTest {
 protected:
  void put_text(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
  }

  // The names in the directory (without . and ..).
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    DIR* d = ::opendir(dir_.c_str());
    if (!d) return names;
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
    return names;
  }

  // `cpuattn heatmap <args>`, expected to succeed; returns the decoded heat.png.
  hm::Image run_ok(const std::string& args, Result* result = nullptr) const {
    std::remove(path("heat.png").c_str());
    const Result r = run("heatmap " + args);
    EXPECT_EQ(r.exit_code, 0) << "cpuattn heatmap " << args << "\nstderr: " << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_NE(r.out.find("wrote heat.png"), std::string::npos) << r.out;
    if (result) *result = r;
    if (r.exit_code != 0) return {};
    return read_png(path("heat.png"));
  }

  // `cpuattn heatmap <args>`, expected to fail: exit 2, one line "cpuattn: ..." on stderr that
  // contains every string of `mentions`, and no file created. Returns stderr.
  std::string run_bad(const std::string& args, std::initializer_list<std::string> mentions) const {
    const std::vector<std::string> before = listing();
    const Result r = run("heatmap " + args);
    EXPECT_EQ(r.exit_code, 2) << "cpuattn heatmap " << args << "\nstderr: " << r.err;
    EXPECT_EQ(r.err.rfind("cpuattn: ", 0), 0u) << r.err;
    EXPECT_FALSE(r.err.empty());
    if (!r.err.empty()) {
      EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "stderr is not one line: " << r.err;
    }
    for (const std::string& m : mentions) {
      EXPECT_NE(r.err.find(m), std::string::npos) << "stderr lacks '" << m << "': " << r.err;
    }
    EXPECT_EQ(r.out, "");
    EXPECT_FALSE(exists(path("heat.png"))) << args;
    EXPECT_FALSE(exists(path("heat.svg"))) << args;
    EXPECT_EQ(listing(), before) << "files were created by: " << args;
    return r.err;
  }
};

// Weights [B, H, Lq, Lk] where every (b, h) slice differs: row i of slice s has its largest
// weight at column (i + s) % Lk, 0.05 * (s + 1) elsewhere.
std::vector<float> slices(int B, int H, int Lq, int Lk) {
  std::vector<float> v;
  for (int s = 0; s < B * H; ++s) {
    for (int i = 0; i < Lq; ++i) {
      for (int j = 0; j < Lk; ++j) v.push_back(j == (i + s) % Lk ? 0.9f : 0.05f * (s + 1));
    }
  }
  return v;
}

hm::Matrix slice(const std::vector<float>& all, int s, int Lq, int Lk) {
  const auto begin = all.begin() + static_cast<std::ptrdiff_t>(s) * Lq * Lk;
  return matrix(Lq, Lk, std::vector<float>(begin, begin + Lq * Lk));
}

// The image `cpuattn heatmap` should produce for `m` with automatic cells.
std::vector<std::uint8_t> expected(const hm::Matrix& m) { return hm::render(m, {}).rgb; }

TEST_F(HeatmapCli, Rank2) {
  const std::vector<float> v = slices(1, 1, 5, 6);
  put("w.npy", npy::from_values<float>({5, 6}, v));
  Result r;
  const hm::Image img = run_ok("--weights w.npy --out heat.png", &r);
  EXPECT_EQ(img.rgb, expected(slice(v, 0, 5, 6)));
  EXPECT_EQ(r.out.find("heat.svg"), std::string::npos);
  EXPECT_FALSE(exists(path("heat.svg")));
  // A given --cell is used.
  const hm::Image big = run_ok("--weights w.npy --out heat.png --cell 3");
  hm::Options o;
  o.cell = 3;
  EXPECT_EQ(big.width, hm::layout(5, 6, o).width);
  EXPECT_TRUE(cell_is(big, 3, 0, 0, kTop));
  EXPECT_EQ(big.rgb, hm::render(slice(v, 0, 5, 6), o).rgb);
}

TEST_F(HeatmapCli, Rank3SelectsTheHead) {
  const std::vector<float> v = slices(1, 3, 4, 5);
  put("w.npy", npy::from_values<float>({3, 4, 5}, v));
  for (int h = 0; h < 3; ++h) {
    SCOPED_TRACE(h);
    const hm::Image img = run_ok("--weights w.npy --out heat.png --head " + std::to_string(h));
    EXPECT_EQ(img.rgb, expected(slice(v, h, 4, 5)));
    for (int other = 0; other < 3; ++other) {
      if (other != h) {
        EXPECT_NE(img.rgb, expected(slice(v, other, 4, 5)));
      }
    }
  }
  EXPECT_EQ(run_ok("--weights w.npy --out heat.png").rgb, expected(slice(v, 0, 4, 5)));
}

TEST_F(HeatmapCli, Rank4SelectsBatchAndHead) {
  const std::vector<float> v = slices(2, 3, 4, 5);
  put("w.npy", npy::from_values<float>({2, 3, 4, 5}, v));
  // float64 is read too.
  put("w64.npy", npy::from_values<double>({2, 3, 4, 5}, std::vector<double>(v.begin(), v.end())));
  for (int b = 0; b < 2; ++b) {
    for (int h = 0; h < 3; ++h) {
      SCOPED_TRACE(::testing::Message() << "b " << b << " h " << h);
      const std::string sel =
          " --out heat.png --batch " + std::to_string(b) + " --head " + std::to_string(h);
      const hm::Image img = run_ok("--weights w.npy" + sel);
      EXPECT_EQ(img.rgb, expected(slice(v, b * 3 + h, 4, 5)));
      EXPECT_EQ(run_ok("--weights w64.npy" + sel).rgb, img.rgb);
    }
  }
  EXPECT_EQ(run_ok("--weights w.npy --out heat.png").rgb, expected(slice(v, 0, 4, 5)));
  EXPECT_EQ(run_ok("--weights w.npy --out heat.png --head 2").rgb, expected(slice(v, 2, 4, 5)));
  EXPECT_EQ(run_ok("--weights w.npy --out heat.png --batch 1").rgb, expected(slice(v, 3, 4, 5)));
}

TEST_F(HeatmapCli, LabelsWriteAnEscapedSvg) {
  put("w.npy", npy::from_values<float>({2, 3}, slices(1, 1, 2, 3)));
  put_text("rows.txt", "L'accord\n<end>\n");
  put_text("cols.txt", "Tom & Jerry\r\n\"x\" > y\nété\r\n");
  Result r;
  const hm::Image img =
      run_ok("--weights w.npy --out heat.png --row-labels rows.txt --col-labels cols.txt", &r);
  EXPECT_EQ(img.rgb, expected(slice(slices(1, 1, 2, 3), 0, 2, 3)));
  EXPECT_EQ(r.out, "wrote heat.png (" + std::to_string(img.width) + " x " +
                       std::to_string(img.height) +
                       " px: 2 x 3 cells of 64 px, colour scale 0 to 0.9)\nwrote heat.svg\n");
  const std::string svg = slurp(path("heat.svg"));
  for (const char* label :
       {">L&apos;accord</text>", ">&lt;end&gt;</text>", ">Tom &amp; Jerry</text>",
        ">&quot;x&quot; &gt; y</text>", ">été</text>"}) {
    EXPECT_EQ(count(svg, label), 1u) << label;
  }
  EXPECT_EQ(svg.find("<end>"), std::string::npos);
  EXPECT_EQ(svg.find("Tom & Jerry"), std::string::npos);
  EXPECT_NE(svg.find("<title>Attention weights of w.npy</title>"), std::string::npos);

  // Only column labels: still an SVG, rows numbered; next to an --out in a subdirectory.
  ASSERT_EQ(::mkdir(path("sub").c_str(), 0777), 0);
  const Result r2 = run("heatmap --weights w.npy --out sub/a.b.png --col-labels cols.txt");
  EXPECT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_NE(r2.out.find("wrote sub/a.b.svg"), std::string::npos) << r2.out;
  EXPECT_TRUE(exists(path("sub/a.b.png")));
  const std::string svg2 = slurp(path("sub/a.b.svg"));
  EXPECT_NE(svg2.find(">0</text>"), std::string::npos);
  EXPECT_NE(svg2.find(">Tom &amp; Jerry</text>"), std::string::npos);
}

TEST_F(HeatmapCli, BadInputs) {
  put("w2.npy", npy::from_values<float>({2, 3}, slices(1, 1, 2, 3)));
  put("w3.npy", npy::from_values<float>({3, 2, 3}, slices(1, 3, 2, 3)));
  put("w4.npy", npy::from_values<float>({2, 3, 2, 3}, slices(2, 3, 2, 3)));
  put("w1.npy", npy::from_values<float>({6}, slices(1, 1, 2, 3)));
  put("w5.npy", npy::from_values<float>({1, 1, 1, 2, 3}, slices(1, 1, 2, 3)));
  put("i32.npy", npy::from_values<std::int32_t>({2, 3}, {1, 0, 0, 0, 1, 0}));
  put("bool.npy", npy::from_values<bool>({2, 3}, {true, false, false, false, true, false}));
  put("empty.npy", npy::zeros(DType::f32, {2, 0}));
  put_text("rows2.txt", "a\nb\n");
  put_text("rows3.txt", "a\nb\nc\n");
  put_text("cols3.txt", "x\ny\nz\n");
  put_text("bad_utf8.txt", "x\n\xff\nz\n");
  const std::string out = " --out heat.png";

  run_bad("--weights missing.npy" + out, {"missing.npy", "cannot open"});
  run_bad("--weights w1.npy" + out, {"w1.npy", "(6,)", "rank 2"});
  run_bad("--weights w5.npy" + out, {"w5.npy", "(1, 1, 1, 2, 3)", "rank 2"});
  run_bad("--weights i32.npy" + out, {"i32.npy", "int32", "float32 or float64"});
  run_bad("--weights bool.npy" + out, {"bool.npy", "bool", "float32 or float64"});
  run_bad("--weights empty.npy" + out, {"empty.npy", "(2, 0)", "at least 1"});
  run_bad("--weights w3.npy --head 3" + out, {"--head 3", "out of range", "(3, 2, 3)", "0..2"});
  run_bad("--weights w3.npy --head -1" + out, {"--head -1", "out of range", "(3, 2, 3)"});
  run_bad("--weights w4.npy --head 3" + out, {"--head 3", "(2, 3, 2, 3)", "3 heads"});
  run_bad("--weights w4.npy --batch 2" + out, {"--batch 2", "(2, 3, 2, 3)", "2 batches"});
  run_bad("--weights w2.npy --head 0" + out, {"--head", "(2, 3)", "no head axis"});
  run_bad("--weights w2.npy --batch 0" + out, {"--batch", "(2, 3)", "no batch axis"});
  run_bad("--weights w3.npy --batch 0" + out, {"--batch", "(3, 2, 3)", "no batch axis"});
  run_bad("--weights w2.npy --row-labels rows3.txt" + out,
          {"--row-labels", "rows3.txt", "3 labels", "Lq (rows) = 2"});
  run_bad("--weights w2.npy --col-labels rows2.txt" + out,
          {"--col-labels", "rows2.txt", "2 labels", "Lk (columns) = 3"});
  run_bad("--weights w2.npy --row-labels rows2.txt --col-labels nope.txt" + out,
          {"--col-labels", "nope.txt", "cannot open"});
  run_bad("--weights w2.npy --col-labels bad_utf8.txt" + out,
          {"--col-labels", "bad_utf8.txt", "line 2", "UTF-8"});
  run_bad("--weights w2.npy --out heat.svg --row-labels rows2.txt", {"--out", "heat.svg"});
  run_bad("--weights w2.npy --out heat.png --cell 0", {"--cell"});
  run_bad("--weights w2.npy --out heat.png --cell 1000", {"--cell"});
  run_bad("--weights w2.npy --out heat.png --head x", {"--head"});
  run_bad("--weights w2.npy", {"--out"});
  run_bad("--weights w2.npy --out nodir/heat.png", {"nodir/heat.png"});
  run_bad("--weights w2.npy --out nodir/heat.png --row-labels rows2.txt", {"nodir/heat"});
}

TEST_F(HeatmapCli, FailingPngRemovesTheSvg) {
  put("w.npy", npy::from_values<float>({2, 3}, slices(1, 1, 2, 3)));
  put_text("rows.txt", "a\nb\n");
  // heat.png is a directory: the SVG is written first, then the PNG's rename fails.
  ASSERT_EQ(::mkdir(path("heat.png").c_str(), 0777), 0);
  ASSERT_EQ(::mkdir(path("heat.png/x").c_str(), 0777), 0);
  const Result r = run("heatmap --weights w.npy --out heat.png --row-labels rows.txt");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("heat.png"), std::string::npos) << r.err;
  EXPECT_FALSE(exists(path("heat.svg")));
}

TEST_F(HeatmapCli, Help) {
  const Result r = run("heatmap --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* s : {"--weights", "--out", "--head", "--batch", "--row-labels", "--col-labels",
                        "--cell", ".svg", "viridis", "NaN"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
  }
}

}  // namespace
