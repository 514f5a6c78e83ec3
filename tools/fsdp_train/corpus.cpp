// The built-in corpus: village stories generated from a small grammar.
//
// Invariants: the text is a pure function of the constants in this file. Choices come from our
// own SplitMix64 stream with a fixed seed and plain modulo picks, never from <random>'s
// distributions (whose outputs differ between standard libraries), so every platform builds the
// same bytes and a loss curve from one machine means the same on another. The text is built
// once, on first use, under a function-local static (thread-safe since C++11).
#include <fsdp_train/corpus.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <string>

namespace fsdp::train {
namespace {

constexpr uint64_t kCorpusSeed = 20240611;
constexpr size_t kTargetBytes = 32 * 1024;

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  template <typename T, size_t N>
  const T& pick(const std::array<T, N>& items) {
    return items[next() % N];
  }
  size_t below(size_t n) { return next() % n; }

 private:
  uint64_t state_;
};

// A small, closed vocabulary: the fewer distinct words, the sooner a tiny model knows them all
// and can spend its capacity on the sentence shapes.
constexpr std::array<const char*, 12> kPeople = {
    "the old miller", "the young baker", "a grey fox",     "the small girl",
    "her brother",    "the tall sailor", "a brown dog",    "the quiet teacher",
    "the farmer",     "a little bird",   "the blacksmith", "my grandmother"};
constexpr std::array<const char*, 12> kObjects = {
    "a blue kettle",    "the wooden gate", "a red apple",     "an old map",
    "a loaf of bread",  "the green boat",  "a heavy key",     "a warm blanket",
    "the broken clock", "a jar of honey",  "the silver bell", "a bundle of letters"};
constexpr std::array<const char*, 8> kPlaces = {"near the river",
                                                "in the market",
                                                "under the bridge",
                                                "by the mill",
                                                "at the edge of the forest",
                                                "behind the school",
                                                "on the hill",
                                                "inside the barn"};
constexpr std::array<const char*, 8> kTimes = {
    "in the morning", "after the rain",      "before supper",      "on a cold day",
    "at noon",        "late in the evening", "when the bell rang", "early on sunday"};
constexpr std::array<const char*, 8> kFeelings = {"happy", "tired",  "surprised", "worried",
                                                  "proud", "hungry", "glad",      "sleepy"};
// Transitive verbs: simple past and past participle.
constexpr std::array<std::array<const char*, 2>, 10> kVerbs = {{{"found", "found"},
                                                                {"carried", "carried"},
                                                                {"painted", "painted"},
                                                                {"mended", "mended"},
                                                                {"lost", "lost"},
                                                                {"bought", "bought"},
                                                                {"sold", "sold"},
                                                                {"washed", "washed"},
                                                                {"hid", "hidden"},
                                                                {"opened", "opened"}}};
constexpr std::array<const char*, 8> kMotions = {"walked", "ran",   "sat",    "waited",
                                                 "sang",   "slept", "danced", "worked"};

std::string capitalized(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
  return s;
}

// Every choice is drawn into a local, in a fixed order, before any text is assembled: the
// operands of + are unsequenced, so two picks inside one expression could run in either order.
std::string sentence(SplitMix64& rng, const std::string& hero) {
  const size_t shape = rng.below(7);
  // The subject is the story's hero half the time; `other` is always someone else.
  const std::string subject = rng.below(2) == 0 ? hero : rng.pick(kPeople);
  size_t other_index = rng.below(kPeople.size() - 1);
  if (kPeople[other_index] == subject) other_index = kPeople.size() - 1;
  const std::string other = kPeople[other_index];
  const auto& verb = rng.pick(kVerbs);
  const auto& verb2 = rng.pick(kVerbs);
  const std::string object = rng.pick(kObjects);
  const std::string object2 = rng.pick(kObjects);
  const std::string place = rng.pick(kPlaces);
  const std::string place2 = rng.pick(kPlaces);
  const std::string time = rng.pick(kTimes);
  const std::string motion = rng.pick(kMotions);
  const std::string motion2 = rng.pick(kMotions);
  const std::string feeling = rng.pick(kFeelings);
  switch (shape) {
    case 0:
      return capitalized(time) + ", " + subject + " " + verb[0] + " " + object + " " + place + ".";
    case 1:
      return capitalized(subject) + " " + verb[0] + " " + object + " and " + verb2[0] + " " +
             object2 + ".";
    case 2:
      return capitalized(subject) + " " + motion + " " + place + " until " + other + " came home.";
    case 3:
      return capitalized(subject) + " was " + feeling + " because " + other + " had " + verb[1] +
             " " + object + ".";
    case 4:
      return "\"Have you seen " + object + "?\" asked " + subject + ". \"Yes, I saw it " + place +
             ",\" said " + other + ".";
    case 5:
      return capitalized(subject) + " " + motion + " " + place + ", and " + other + " " + motion2 +
             " " + place2 + ".";
    default:
      return capitalized(time) + ", " + subject + " felt " + feeling + " and " + motion + " " +
             place + ".";
  }
}

std::string build_corpus() {
  SplitMix64 rng(kCorpusSeed);
  std::string text;
  text.reserve(kTargetBytes + 1024);
  while (text.size() < kTargetBytes) {
    const std::string hero = rng.pick(kPeople);
    const std::string home = rng.pick(kPlaces);
    text += "Once upon a time, " + hero + " lived " + home + ".";
    const size_t sentences = 3 + rng.below(4);
    for (size_t i = 0; i < sentences; ++i) text += " " + sentence(rng, hero);
    text += " The end.\n\n";
  }
  return text;
}

}  // namespace

std::string_view default_corpus() {
  static const std::string corpus = build_corpus();
  return corpus;
}

double unigram_entropy_nats(std::string_view text) {
  if (text.empty()) return 0.0;
  std::array<int64_t, 256> counts{};
  for (unsigned char ch : text) ++counts[ch];
  const double n = static_cast<double>(text.size());
  double entropy = 0.0;
  for (int64_t count : counts) {
    if (count == 0) continue;
    const double p = static_cast<double>(count) / n;
    entropy -= p * std::log(p);
  }
  return entropy;
}

}  // namespace fsdp::train
