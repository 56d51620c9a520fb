// Signed steps' cryptography (signing.h): keys, digests and envelopes.
#include "src/sync/signing.h"

#include <doctest/doctest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "src/common/status_macros.h"
#include "tests/sync/sync_test_util.h"

namespace arc_v3 {
namespace sync {
namespace {

using test::TempDir;

constexpr char kType[] = "application/vnd.arc-v3.sync+json";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A file's one public key.
Status LoadOne(const std::string& path, PublicKey* key) {
  std::vector<PublicKey> keys;
  ARC_V3_RETURN_IF_ERROR(PublicKey::LoadAll(path, &keys));
  if (keys.size() != 1) return Status(ErrorCode::kInvalidArgument, path + ": not one key");
  *key = keys[0];
  return Status::Ok();
}

TEST_CASE("signing: SHA-256 and base64 match their standards' vectors") {
  CHECK(DigestHex(Sha256(std::string("abc"))) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(DigestHex(Sha256(std::string())) ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256Stream stream;
  stream.Update("a", 1);
  stream.Update("bc", 2);
  CHECK(DigestHex(stream.Final()) == DigestHex(Sha256(std::string("abc"))));
  Digest d{};
  CHECK(ParseDigestHex(DigestHex(Sha256(std::string("abc"))), &d));
  CHECK(d == Sha256(std::string("abc")));
  CHECK_FALSE(
      ParseDigestHex("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD", &d));
  CHECK_FALSE(ParseDigestHex("ba78", &d));
  // RFC 4648, section 10.
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& v : vectors) {
    CHECK(Base64(v.first) == v.second);
    std::string back;
    CHECK(ParseBase64(v.second, &back));
    CHECK(back == v.first);
  }
  std::string out;
  for (const char* bad :
       {"Zg", "Zg=", "Zh==", "Z===", " Zg==", "Zg==\n", "Zm9v\nYmFy", "Zm9-", "=Zg="}) {
    INFO("text '", bad, "'");
    CHECK_FALSE(ParseBase64(bad, &out));
  }
}

TEST_CASE("signing: DSSE's pre-authentication encoding is the specification's") {
  CHECK(Pae("http://example.com/HelloWorld", "hello world") ==
        "DSSEv1 29 http://example.com/HelloWorld 11 hello world");
  CHECK(Pae("", "") == "DSSEv1 0  0 ");
}

TEST_CASE("signing: keys written, loaded and interchangeable with openssl's own files") {
  TempDir tmp;
  SigningKey key;
  REQUIRE(SigningKey::Generate(&key).ok());
  CHECK(key.id().size() == 64);
  const std::string path = tmp / "trainer.key";
  REQUIRE(key.Write(path).ok());
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(ReadAll(path).rfind("-----BEGIN PRIVATE KEY-----", 0) == 0);
  CHECK(ReadAll(path + ".pub").rfind("-----BEGIN PUBLIC KEY-----", 0) == 0);
  // Neither file is replaced.
  SigningKey other;
  REQUIRE(SigningKey::Generate(&other).ok());
  CHECK(other.Write(path).code() == ErrorCode::kAlreadyExists);
  CHECK(ReadAll(path + ".pub") == key.PublicPem());
  CHECK(other.id() != key.id());

  SigningKey loaded;
  REQUIRE(SigningKey::Load(path, &loaded).ok());
  CHECK(loaded.id() == key.id());
  PublicKey pub;
  REQUIRE(LoadOne(path + ".pub", &pub).ok());
  CHECK(pub.id() == key.id());
  std::string sig;
  REQUIRE(loaded.Sign("message", &sig).ok());
  CHECK(sig.size() == 64);
  CHECK(pub.Verify("message", sig));
  CHECK_FALSE(pub.Verify("messagE", sig));
  CHECK_FALSE(pub.Verify("message", sig.substr(0, 63)));
  PublicKey wrong;
  REQUIRE(PublicKey::FromPem(other.PublicPem(), "other", &wrong).ok());
  CHECK_FALSE(wrong.Verify("message", sig));

  // Not keys: a missing file, text, a truncated PEM, an RSA key.
  CHECK(SigningKey::Load(tmp / "none", &loaded).code() == ErrorCode::kInvalidArgument);
  { std::ofstream(tmp / "text") << "hello\n"; }
  CHECK(LoadOne(tmp / "text", &pub).code() == ErrorCode::kInvalidArgument);
  const std::string pem = ReadAll(path + ".pub");
  { std::ofstream(tmp / "cut.pub") << pem.substr(0, pem.size() / 2); }
  CHECK(LoadOne(tmp / "cut.pub", &pub).code() == ErrorCode::kInvalidArgument);
  if (std::system("command -v openssl > /dev/null") == 0) {
    const std::string rsa = tmp / "rsa.pem", ed = tmp / "ed.pem";
    REQUIRE(std::system(("openssl genpkey -algorithm rsa -pkeyopt rsa_keygen_bits:1024 -out " +
                         rsa + " 2> /dev/null")
                            .c_str()) == 0);
    const Status s = SigningKey::Load(rsa, &loaded);
    CHECK(s.code() == ErrorCode::kInvalidArgument);
    CHECK(s.message().find("not an Ed25519 key") != std::string::npos);
    // openssl's Ed25519 files are ours.
    REQUIRE(std::system(("openssl genpkey -algorithm ed25519 -out " + ed + " && openssl pkey -in " +
                         ed + " -pubout -out " + ed + ".pub")
                            .c_str()) == 0);
    REQUIRE(SigningKey::Load(ed, &loaded).ok());
    REQUIRE(LoadOne(ed + ".pub", &pub).ok());
    CHECK(pub.id() == loaded.id());
    REQUIRE(loaded.Sign("m", &sig).ok());
    CHECK(pub.Verify("m", sig));
    // And ours are openssl's: it verifies our signature with our public key file.
    { std::ofstream(tmp / "msg", std::ios::binary) << "payload"; }
    REQUIRE(key.Sign("payload", &sig).ok());
    { std::ofstream(tmp / "msg.sig", std::ios::binary) << sig; }
    CHECK(std::system(("openssl pkeyutl -verify -pubin -inkey " + path + ".pub -rawin -in " +
                       tmp / "msg" + " -sigfile " + tmp / "msg.sig > /dev/null")
                          .c_str()) == 0);
  } else {
    MESSAGE("openssl(1) is not installed: its key files were not tried");
  }
}

TEST_CASE(
    "signing: a trust file's every key is trusted; what is no public key is refused, saying what "
    "to give") {
  TempDir tmp;
  SigningKey a, b;
  REQUIRE(SigningKey::Generate(&a).ok());
  REQUIRE(SigningKey::Generate(&b).ok());
  REQUIRE(a.Write(tmp / "a.key").ok());
  const std::string two = tmp / "two.pub";
  // Two keys in one file (the trainer's second): both are trusted, in order.
  WriteText(two, b.PublicPem() + "\n" + a.PublicPem());
  std::vector<PublicKey> keys;
  REQUIRE(PublicKey::LoadAll(two, &keys).ok());
  REQUIRE(keys.size() == 2);
  CHECK(keys[0].id() == b.id());
  CHECK(keys[1].id() == a.id());
  std::string sig;
  REQUIRE(a.Sign("m", &sig).ok());
  CHECK(keys[1].Verify("m", sig));
  const auto refused = [&](const std::string& name, const std::string& text,
                           const std::string& says) {
    INFO(name);
    WriteText(tmp / name, text);
    const Status s = PublicKey::LoadAll(tmp / name, &keys);
    CHECK(s.code() == ErrorCode::kInvalidArgument);
    CHECK(s.message().find(says) != std::string::npos);
    CHECK(s.message().find(tmp / name) != std::string::npos);
    INFO(s.message());
  };
  const std::string priv = ReadAll(tmp / "a.key");
  refused("private.pem", priv, "is a private key: trust takes the public half");
  refused("both.pem", a.PublicPem() + priv, "is a private key");
  refused("trailing.pub", a.PublicPem() + "garbage\n", "line 4: text outside a PEM block");
  refused("leading.pub", "# trainer key\n" + a.PublicPem(), "line 1: text outside a PEM block");
  refused("empty.pub", "\n \n", "holds no PEM public key");
  refused("unended.pub", a.PublicPem().substr(0, a.PublicPem().rfind("-----END")), "does not end");
  refused("cert.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
          "not a public key");
  // A signing key must be one unencrypted private key.
  SigningKey loaded;
  Status s = SigningKey::Load(tmp / "a.key.pub", &loaded);
  CHECK(s.code() == ErrorCode::kInvalidArgument);
  CHECK(s.message().find("signing needs the private key") != std::string::npos);
  WriteText(tmp / "extra.key", priv + "more\n");
  CHECK(SigningKey::Load(tmp / "extra.key", &loaded).code() == ErrorCode::kInvalidArgument);
  if (std::system("command -v openssl > /dev/null") == 0) {
    // Encrypted: refused at once with what to do, never a passphrase prompt (stdin closed).
    const std::string enc = tmp / "enc.key";
    REQUIRE(std::system(("openssl genpkey -algorithm ed25519 -aes-256-cbc -pass pass:secret -out " +
                         enc + " 2> /dev/null")
                            .c_str()) == 0);
    s = SigningKey::Load(enc, &loaded);
    CHECK(s.code() == ErrorCode::kInvalidArgument);
    CHECK(s.message().find("is encrypted") != std::string::npos);
    CHECK(PublicKey::LoadAll(enc, &keys).code() == ErrorCode::kInvalidArgument);
    // An RSA public key is no trust.
    const std::string rsa = tmp / "rsa.pem";
    REQUIRE(std::system(("openssl genpkey -algorithm rsa -pkeyopt rsa_keygen_bits:1024 2> "
                         "/dev/null | openssl pkey "
                         "-pubout -out " +
                         rsa)
                            .c_str()) == 0);
    s = PublicKey::LoadAll(rsa, &keys);
    CHECK(s.message().find("not an Ed25519 key") != std::string::npos);
  } else {
    MESSAGE("openssl(1) is not installed: encrypted and RSA keys were not tried");
  }
}

TEST_CASE("signing: envelopes verify by a trusted key only, and damage is refused") {
  SigningKey a, b;
  REQUIRE(SigningKey::Generate(&a).ok());
  REQUIRE(SigningKey::Generate(&b).ok());
  const std::string payload = "{\"format\": \"arc_v3-sync\", \"version\": 2, \"kind\": \"step\"}\n";
  std::string bytes;
  REQUIRE(SignEnvelope(a, kType, payload, &bytes).ok());
  CHECK(LooksLikeEnvelope(bytes));
  CHECK_FALSE(LooksLikeEnvelope(payload));
  Envelope e;
  REQUIRE(ParseEnvelope(bytes, "steps/1", &e).ok());
  CHECK(e.payload == payload);
  CHECK(e.type == kType);
  REQUIRE(e.signatures.size() == 1);
  CHECK(e.signatures[0].keyid == a.id());
  std::string keyid;
  // Trusted: a alone, or a and b (a key rotated mid-run).
  CHECK(VerifyEnvelope(e, kType, {a.public_key()}, "steps/1", &keyid).ok());
  CHECK(keyid == a.id());
  CHECK(VerifyEnvelope(e, kType, {b.public_key(), a.public_key()}, "steps/1", &keyid).ok());
  CHECK(keyid == a.id());
  // Another key only.
  Status s = VerifyEnvelope(e, kType, {b.public_key()}, "steps/1", &keyid);
  CHECK(s.code() == ErrorCode::kUntrusted);
  CHECK(s.message().find("no trusted key") != std::string::npos);
  CHECK(s.message().find(a.id()) != std::string::npos);
  // Another type: a signature made for one kind of document is not one for another.
  s = VerifyEnvelope(e, "application/vnd.in-toto+json", {a.public_key()}, "steps/1", &keyid);
  CHECK(s.code() == ErrorCode::kUntrusted);
  // A payload changed under the signature, a signature cut short, one byte of it flipped,
  // and a keyid changed to another trusted key's.
  Envelope changed = e;
  changed.payload[changed.payload.size() - 3] ^= 1;
  CHECK(VerifyEnvelope(changed, kType, {a.public_key()}, "steps/1", &keyid).code() ==
        ErrorCode::kUntrusted);
  Envelope cut = e;
  cut.signatures[0].sig.resize(40);
  s = VerifyEnvelope(cut, kType, {a.public_key()}, "steps/1", &keyid);
  CHECK(s.code() == ErrorCode::kUntrusted);
  CHECK(s.message().find("does not verify") != std::string::npos);
  Envelope flipped = e;
  flipped.signatures[0].sig[5] ^= 0x10;
  CHECK(VerifyEnvelope(flipped, kType, {a.public_key()}, "steps/1", &keyid).code() ==
        ErrorCode::kUntrusted);
  Envelope renamed = e;
  renamed.signatures[0].keyid = b.id();
  CHECK(
      VerifyEnvelope(renamed, kType, {a.public_key(), b.public_key()}, "steps/1", &keyid).code() ==
      ErrorCode::kUntrusted);
  // A second signature by a trusted key is enough; one without a keyid is tried on every key.
  std::string by_b;
  REQUIRE(b.Sign(Pae(kType, payload), &by_b).ok());
  Envelope both = e;
  both.signatures.insert(both.signatures.begin(), {std::string(), by_b});
  CHECK(VerifyEnvelope(both, kType, {b.public_key()}, "steps/1", &keyid).ok());
  CHECK(keyid == b.id());
  // Not envelopes.
  for (const std::string& bad :
       {std::string("{\"payload\": \"e30=\", \"payloadType\": \"t\", \"signatures\": []}"),
        std::string("{\"payload\": \"e30\", \"payloadType\": \"t\", \"signatures\": [{\"sig\": "
                    "\"AAAA\"}]}"),
        std::string("{\"payload\": \"e30=\", \"payloadType\": \"t\", \"signatures\": [{\"sig\": "
                    "\"AAAA\", \"x\": 1}]}"),
        std::string("{\"payload\": \"e30=\", \"signatures\": [{\"sig\": \"AAAA\"}]}"),
        std::string(
            "{\"payload\": \"e30=\", \"payloadType\": 7, \"signatures\": [{\"sig\": \"AAAA\"}]}"),
        bytes.substr(0, bytes.size() / 2)}) {
    INFO("envelope ", bad);
    CHECK(ParseEnvelope(bad, "steps/1", &e).code() == ErrorCode::kCorruptHeader);
  }
}

}  // namespace
}  // namespace sync
}  // namespace arc_v3
