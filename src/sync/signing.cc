// Keys, digests and DSSE envelopes over OpenSSL's libcrypto (see signing.h).
#include "src/sync/signing.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "src/checkpoint/strict_json.h"
#include "src/common/file_io.h"
#include "src/common/status_macros.h"

namespace arc_v3 {
namespace sync {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

EVP_PKEY* Key(const std::shared_ptr<void>& key) { return static_cast<EVP_PKEY*>(key.get()); }
std::shared_ptr<void> Own(EVP_PKEY* key) {
  return std::shared_ptr<void>(key, [](void* k) { EVP_PKEY_free(static_cast<EVP_PKEY*>(k)); });
}

// The bytes of a BIO written in memory.
std::string Drain(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return n > 0 ? std::string(data, static_cast<size_t>(n)) : std::string();
}

Status ReadText(const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(ErrorCode::kInvalidArgument, "cannot read key file " + path);
  std::ostringstream s;
  s << in.rdbuf();
  if (s.str().size() > 64 * 1024)
    return Status(ErrorCode::kInvalidArgument, path + " is not a key file (too large)");
  *text = s.str();
  return Status::Ok();
}

// A file's PEM blocks (RFC 7468): "-----BEGIN LABEL-----" to "-----END LABEL-----", each
// with its two lines; only whitespace may stand between or around them. OpenSSL decodes
// each block, but skips any text outside them unseen: a key file read in part is refused.
struct PemBlock {
  std::string label, text;
};
Status SplitPem(const std::string& text, const std::string& name, std::vector<PemBlock>* blocks) {
  blocks->clear();
  const auto blank = [](const std::string& line) {
    return line.find_first_not_of(" \t\r") == std::string::npos;
  };
  const auto trimmed = [](std::string line) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
      line.pop_back();
    return line;
  };
  std::istringstream in(text);
  std::string line;
  PemBlock* open = nullptr;
  for (size_t number = 1; std::getline(in, line); ++number) {
    const std::string t = trimmed(line);
    const std::string at = name + ", line " + std::to_string(number);
    if (open == nullptr) {
      if (blank(t)) continue;
      if (t.rfind("-----BEGIN ", 0) != 0 || t.size() < 16 ||
          t.compare(t.size() - 5, 5, "-----") != 0) {
        return Status(ErrorCode::kInvalidArgument,
                      at + ": text outside a PEM block (a key file holds PEM keys only)");
      }
      blocks->push_back({t.substr(11, t.size() - 16), ""});
      open = &blocks->back();
    } else if (t.rfind("-----", 0) == 0 && t != "-----END " + open->label + "-----") {
      return Status(ErrorCode::kInvalidArgument,
                    at + ": a PEM block '" + open->label + "' that does not end");
    }
    open->text += t + "\n";
    if (t == "-----END " + open->label + "-----") open = nullptr;
  }
  if (open != nullptr)
    return Status(ErrorCode::kInvalidArgument,
                  name + ": the PEM block '" + open->label + "' does not end");
  return Status::Ok();
}

// What a file of private keys is told when it is given for trust, and the other way round.
bool PrivateLabel(const std::string& label) {
  return label.find("PRIVATE KEY") != std::string::npos;
}

// Never asks for a passphrase: an encrypted key is refused with a message instead.
int NoPassphrase(char*, int, int, void*) { return -1; }

// `key` if it is an Ed25519 key, else an error naming `name`.
Status Ed25519Only(EVP_PKEY* key, const std::string& name, const char* what) {
  if (key == nullptr) return Status(ErrorCode::kInvalidArgument, name + " is not a PEM " + what);
  if (EVP_PKEY_get_id(key) != EVP_PKEY_ED25519) {
    EVP_PKEY_free(key);
    return Status(ErrorCode::kInvalidArgument, name + " is not an Ed25519 key");
  }
  return Status::Ok();
}

std::string KeyId(EVP_PKEY* key) {
  unsigned char* der = nullptr;
  const int n = i2d_PUBKEY(key, &der);
  if (n <= 0) return std::string();
  const std::string id = DigestHex(Sha256(der, static_cast<size_t>(n)));
  OPENSSL_free(der);
  return id;
}

// Writes `text` to a new file `path` of `mode` (create-only).
Status WriteNew(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == EEXIST) return Status(ErrorCode::kAlreadyExists, path + " exists");
    return file_io::Error(path, "cannot create");
  }
  Status s =
      file_io::WriteAt(fd, reinterpret_cast<const uint8_t*>(text.data()), text.size(), 0, path);
  if (s.ok() && ::fsync(fd) != 0) s = file_io::Error(path, "cannot sync");
  ::close(fd);
  if (!s.ok()) ::unlink(path.c_str());
  return s;
}

}  // namespace

Digest Sha256(const void* data, size_t size) {
  Digest digest{};
  unsigned int n = 0;
  EVP_Digest(data, size, digest.data(), &n, EVP_sha256(), nullptr);
  return digest;
}

Sha256Stream::Sha256Stream() : ctx_(EVP_MD_CTX_new()) {
  EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr);
}
Sha256Stream::~Sha256Stream() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }
void Sha256Stream::Update(const void* data, size_t size) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, size);
}
Digest Sha256Stream::Final() {
  Digest digest{};
  unsigned int n = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest.data(), &n);
  return digest;
}

std::string DigestHex(const Digest& digest) {
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (uint8_t b : digest) {
    hex += kHex[b >> 4];
    hex += kHex[b & 15];
  }
  return hex;
}

bool ParseDigestHex(const std::string& hex, Digest* digest) {
  if (hex.size() != 64) return false;
  for (size_t i = 0; i < 32; ++i) {
    int v = 0;
    for (char c : {hex[2 * i], hex[2 * i + 1]}) {
      const int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
      if (d < 0) return false;
      v = v * 16 + d;
    }
    (*digest)[i] = static_cast<uint8_t>(v);
  }
  return true;
}

Status PublicKey::FromPem(const std::string& pem, const std::string& name, PublicKey* key) {
  std::vector<PublicKey> keys;
  ARC_V3_RETURN_IF_ERROR(AllFromPem(pem, name, &keys));
  if (keys.size() != 1)
    return Status(ErrorCode::kInvalidArgument, name + " holds more than one public key");
  *key = std::move(keys[0]);
  return Status::Ok();
}

Status PublicKey::AllFromPem(const std::string& pem, const std::string& name,
                             std::vector<PublicKey>* keys) {
  std::vector<PemBlock> blocks;
  ARC_V3_RETURN_IF_ERROR(SplitPem(pem, name, &blocks));
  if (blocks.empty()) return Status(ErrorCode::kInvalidArgument, name + " holds no PEM public key");
  keys->clear();
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::string which =
        name + (blocks.size() > 1 ? " (key " + std::to_string(i + 1) + ")" : "");
    if (PrivateLabel(blocks[i].label)) {
      return Status(
          ErrorCode::kInvalidArgument,
          which +
              " is a private key: trust takes the public half only (KEY.pub, or `openssl pkey -in "
              "KEY -pubout`); the private key stays with the trainer");
    }
    if (blocks[i].label != "PUBLIC KEY") {
      return Status(ErrorCode::kInvalidArgument,
                    which + " is a PEM '" + blocks[i].label +
                        "', not a public key (-----BEGIN PUBLIC KEY-----)");
    }
    const std::string& text = blocks[i].text;
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(
        BIO_new_mem_buf(text.data(), static_cast<int>(text.size())), BIO_free);
    EVP_PKEY* k = PEM_read_bio_PUBKEY(bio.get(), nullptr, NoPassphrase, nullptr);
    ARC_V3_RETURN_IF_ERROR(Ed25519Only(k, which, "public key"));
    PublicKey key;
    key.key_ = Own(k);
    key.id_ = KeyId(k);
    keys->push_back(std::move(key));
  }
  return Status::Ok();
}

Status PublicKey::LoadAll(const std::string& path, std::vector<PublicKey>* keys) {
  std::string pem;
  ARC_V3_RETURN_IF_ERROR(ReadText(path, &pem));
  return AllFromPem(pem, path, keys);
}

bool PublicKey::Verify(const std::string& message, const std::string& signature) const {
  if (key_ == nullptr || signature.size() != 64) return false;
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, Key(key_)) != 1) return false;
  return EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                          signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
                          message.size()) == 1;
}

Status SigningKey::Generate(SigningKey* key) {
  EVP_PKEY* k = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  if (k == nullptr) return Status(ErrorCode::kInternal, "Ed25519 key generation failed");
  key->key_ = Own(k);
  return PublicKey::FromPem(key->PublicPem(), "the new key", &key->public_);
}

Status SigningKey::Load(const std::string& path, SigningKey* key) {
  std::string pem;
  ARC_V3_RETURN_IF_ERROR(ReadText(path, &pem));
  std::vector<PemBlock> blocks;
  ARC_V3_RETURN_IF_ERROR(SplitPem(pem, path, &blocks));
  if (blocks.size() != 1) {
    return Status(
        ErrorCode::kInvalidArgument,
        path + (blocks.empty() ? " holds no PEM private key" : " holds more than one PEM block"));
  }
  const std::string& label = blocks[0].label;
  if (label == "ENCRYPTED PRIVATE KEY") {
    return Status(
        ErrorCode::kInvalidArgument,
        path +
            " is encrypted: signing reads an unencrypted PKCS#8 key (`openssl pkey -in KEY -out "
            "PLAIN`, kept mode 0600 where the trainer runs)");
  }
  if (label != "PRIVATE KEY") {
    return Status(ErrorCode::kInvalidArgument,
                  path + " is a PEM '" + label +
                      "', not a PKCS#8 private key (-----BEGIN PRIVATE KEY-----, as " +
                      "`openssl genpkey -algorithm ed25519` writes)" +
                      (label == "PUBLIC KEY" ? ": signing needs the private key" : ""));
  }
  const std::string& text = blocks[0].text;
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(text.data(), static_cast<int>(text.size())), BIO_free);
  EVP_PKEY* k = PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr);
  ARC_V3_RETURN_IF_ERROR(Ed25519Only(k, path, "private key"));
  key->key_ = Own(k);
  return PublicKey::FromPem(key->PublicPem(), path, &key->public_);
}

std::string SigningKey::PublicPem() const {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  PEM_write_bio_PUBKEY(bio.get(), Key(key_));
  return Drain(bio.get());
}

Status SigningKey::Write(const std::string& path) const {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  if (PEM_write_bio_PrivateKey(bio.get(), Key(key_), nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return Status(ErrorCode::kInternal, "cannot encode the private key");
  }
  const std::string pub = path + ".pub";
  if (::access(pub.c_str(), F_OK) == 0) return Status(ErrorCode::kAlreadyExists, pub + " exists");
  ARC_V3_RETURN_IF_ERROR(WriteNew(path, Drain(bio.get()), 0600));
  Status s = WriteNew(pub, PublicPem(), 0644);
  if (!s.ok()) ::unlink(path.c_str());
  return s;
}

Status SigningKey::Sign(const std::string& message, std::string* signature) const {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  size_t n = 64;
  signature->assign(64, '\0');
  if (EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, Key(key_)) != 1 ||
      EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(&(*signature)[0]), &n,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1 ||
      n != 64) {
    return Status(ErrorCode::kInternal, "Ed25519 signing failed");
  }
  return Status::Ok();
}

std::string Base64(const std::string& bytes) {
  std::string text(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(&text[0]),
                                reinterpret_cast<const unsigned char*>(bytes.data()),
                                static_cast<int>(bytes.size()));
  text.resize(static_cast<size_t>(n));
  return text;
}

bool ParseBase64(const std::string& text, std::string* bytes) {
  if (text.size() % 4 != 0) return false;
  // EVP_DecodeBlock skips surrounding whitespace and decodes '=' as zero bits: both are
  // refused here, so that one byte string has one text.
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const bool alphabet = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                          (c >= '0' && c <= '9') || c == '+' || c == '/';
    const bool pad =
        c == '=' && i + 2 >= text.size() && (i + 1 == text.size() || text[i + 1] == '=');
    if (!alphabet && !pad) return false;
  }
  const size_t pads =
      text.empty() ? 0 : (text.back() == '=') + (text.size() > 1 && text[text.size() - 2] == '=');
  bytes->assign(3 * (text.size() / 4), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(&(*bytes)[0]),
                                reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  if (n < 0 || static_cast<size_t>(n) < pads) return false;
  bytes->resize(static_cast<size_t>(n) - pads);
  return Base64(*bytes) == text;  // canonical: no stray bits in the last character
}

std::string Pae(const std::string& type, const std::string& payload) {
  return "DSSEv1 " + std::to_string(type.size()) + " " + type + " " +
         std::to_string(payload.size()) + " " + payload;
}

Status SignEnvelope(const SigningKey& key, const std::string& type, const std::string& payload,
                    std::string* envelope) {
  std::string sig;
  ARC_V3_RETURN_IF_ERROR(key.Sign(Pae(type, payload), &sig));
  OrderedJson j;
  j["payload"] = Base64(payload);
  j["payloadType"] = type;
  j["signatures"] = OrderedJson::array({OrderedJson{{"keyid", key.id()}, {"sig", Base64(sig)}}});
  *envelope = j.dump() + "\n";
  return Status::Ok();
}

bool LooksLikeEnvelope(const std::string& bytes) {
  size_t i = 0;
  while (i < bytes.size() &&
         (bytes[i] == ' ' || bytes[i] == '\n' || bytes[i] == '\t' || bytes[i] == '\r'))
    ++i;
  if (i >= bytes.size() || bytes[i] != '{') return false;
  ++i;
  while (i < bytes.size() &&
         (bytes[i] == ' ' || bytes[i] == '\n' || bytes[i] == '\t' || bytes[i] == '\r'))
    ++i;
  return bytes.compare(i, 9, "\"payload\"") == 0 || bytes.compare(i, 13, "\"payloadType\"") == 0;
}

Status ParseEnvelope(const std::string& bytes, const std::string& where, Envelope* envelope) {
  using namespace strict_json;
  try {
    const Json j = Parse(bytes, where);
    CheckFields(j, {"payload", "payloadType", "signatures"}, where);
    envelope->type = Str(Field(j, "payloadType", where), where + ".payloadType");
    if (!ParseBase64(Str(Field(j, "payload", where), where + ".payload"), &envelope->payload)) {
      Fail(where + ".payload is not base64");
    }
    const Json& sigs = Field(j, "signatures", where);
    if (!sigs.is_array() || sigs.empty() || sigs.size() > 16)
      Fail(where + ".signatures is not 1 to 16 signatures");
    envelope->signatures.clear();
    for (const Json& sig : sigs) {
      const std::string at = where + ".signatures[]";
      CheckFields(sig, {"keyid", "sig"}, at);
      Envelope::Signature one;
      const auto keyid = sig.find("keyid");
      if (keyid != sig.end()) one.keyid = Str(*keyid, at + ".keyid");
      if (!ParseBase64(Str(Field(sig, "sig", at), at + ".sig"), &one.sig))
        Fail(at + ".sig is not base64");
      envelope->signatures.push_back(std::move(one));
    }
  } catch (const Json::exception& e) {
    return Status(ErrorCode::kCorruptHeader, where + " is not a DSSE envelope: " + e.what());
  } catch (const Error& e) {
    return Status(ErrorCode::kCorruptHeader, e.what);
  }
  return Status::Ok();
}

Status VerifyEnvelope(const Envelope& envelope, const std::string& type,
                      const std::vector<PublicKey>& trusted, const std::string& where,
                      std::string* keyid) {
  if (envelope.type != type) {
    return Status(ErrorCode::kUntrusted,
                  where + " is signed as '" + envelope.type + "', not '" + type + "'");
  }
  const std::string message = Pae(envelope.type, envelope.payload);
  std::string named, failed;
  for (const Envelope::Signature& sig : envelope.signatures) {
    for (const PublicKey& key : trusted) {
      if (!sig.keyid.empty() && sig.keyid != key.id()) continue;
      if (key.Verify(message, sig.sig)) {
        *keyid = key.id();
        return Status::Ok();
      }
      failed = key.id();
    }
    named +=
        (named.empty() ? "" : ", ") + (sig.keyid.empty() ? std::string("(no keyid)") : sig.keyid);
  }
  if (!failed.empty()) {
    return Status(ErrorCode::kUntrusted,
                  where + ": the signature by trusted key " + failed + " does not verify");
  }
  return Status(ErrorCode::kUntrusted,
                where + " is signed by no trusted key (signed by " + named + ")");
}

}  // namespace sync
}  // namespace arc_v3
