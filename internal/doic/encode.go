package doic

import (
	"bytes"
	_ "embed"
	"sync"
	"time"

	"github.com/fiorix/go-diameter/v4/diam"
	"github.com/fiorix/go-diameter/v4/diam/datatype"
	"github.com/fiorix/go-diameter/v4/diam/dict"
)

// The encoders build AVPs with go-diameter. The agent calls them when what
// it reports changes, not per message, and appends the bytes it keeps.
// None of these AVPs sets the M bit (RFC 7683 §7.9, RFC 8583 §6).

func serialize(a *diam.AVP) []byte {
	b, err := a.Serialize()
	if err != nil {
		panic("doic: encoding a fixed AVP: " + err.Error()) // only fixed-size types: cannot fail
	}
	return b
}

func grouped(code uint32, avps ...*diam.AVP) []byte {
	return serialize(diam.NewAVP(code, 0, 0, &diam.GroupedAVP{AVP: avps}))
}

// EncodeSupported is OC-Supported-Features with features, and the
// SourceID of RFC 8581 §6.1.2 when source is not empty.
func EncodeSupported(features uint64, source string) []byte {
	avps := []*diam.AVP{diam.NewAVP(CodeFeatureVector, 0, 0, datatype.Unsigned64(features))}
	if source != "" {
		avps = append(avps, diam.NewAVP(CodeSourceID, 0, 0, datatype.DiameterIdentity(source)))
	}
	return grouped(CodeSupportedFeatures, avps...)
}

// EncodeOLR is an OC-OLR of type typ; a PEER report carries source as its
// SourceID (RFC 8581 §6.2).
func EncodeOLR(typ ReportType, seq uint64, reduction uint32, validity time.Duration, source string) []byte {
	avps := []*diam.AVP{
		diam.NewAVP(CodeSequenceNumber, 0, 0, datatype.Unsigned64(seq)),
		diam.NewAVP(CodeReportType, 0, 0, datatype.Enumerated(typ)),
		diam.NewAVP(CodeReductionPercent, 0, 0, datatype.Unsigned32(reduction)),
		diam.NewAVP(CodeValidityDuration, 0, 0, datatype.Unsigned32(uint32(validity/time.Second))),
	}
	if typ == PeerReport {
		avps = append(avps, diam.NewAVP(CodeSourceID, 0, 0, datatype.DiameterIdentity(source)))
	}
	return grouped(CodeOLR, avps...)
}

// EncodeLoad is a Load AVP (RFC 8583 §6.1).
func EncodeLoad(typ uint32, value uint64, source string) []byte {
	return grouped(CodeLoad,
		diam.NewAVP(CodeLoadType, 0, 0, datatype.Enumerated(typ)),
		diam.NewAVP(CodeLoadValue, 0, 0, datatype.Unsigned64(value)),
		diam.NewAVP(CodeSourceID, 0, 0, datatype.DiameterIdentity(source)))
}

//go:embed dictionary.xml
var dictionaryXML []byte

var loadOnce sync.Once
var loadErr error

// LoadDictionary adds the AVPs go-diameter's default dictionary lacks
// (RFC 8581's and RFC 8583's, with Load-Value as Unsigned64) to it, once.
// Those who decode messages with go-diameter (test peers, tools) call it;
// the agent itself reads the bytes.
func LoadDictionary() error {
	loadOnce.Do(func() { loadErr = dict.Default.Load(bytes.NewReader(dictionaryXML)) })
	return loadErr
}
