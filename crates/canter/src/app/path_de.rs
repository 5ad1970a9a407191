//! A serde deserializer over decoded path parameters: one value, a tuple or sequence (in route
//! order), or a map or struct (by name). Values parse from text (`"42"` as `u32`, `"true"` as
//! `bool`), and a single parameter can be any primitive or unit enum variant.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};
use serde::forward_to_deserialize_any;

/// A path deserialization error (answered with 400 by [`Path`](super::Path)).
#[derive(Debug)]
pub(crate) struct Error(String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error(msg.to_string())
    }
}

type Param<'a> = (&'a str, Cow<'a, str>);

pub(crate) struct PathDeserializer<'p, 'a> {
    params: &'p [Param<'a>],
}

impl<'p, 'a> PathDeserializer<'p, 'a> {
    pub(crate) fn new(params: &'p [Param<'a>]) -> Self {
        PathDeserializer { params }
    }

    fn single(&self) -> Result<Value<'p>, Error> {
        match self.params {
            [(name, v)] => Ok(Value { name, value: v }),
            _ => Err(Error(format!(
                "expected 1 path parameter, the route has {}",
                self.params.len()
            ))),
        }
    }
}

macro_rules! single_value {
    ($($method:ident)*) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            self.single()?.$method(visitor)
        })*
    };
}

impl<'de> de::Deserializer<'de> for PathDeserializer<'_, '_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_map(visitor)
    }

    single_value! {
        deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64
        deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64
        deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char deserialize_str
        deserialize_string deserialize_bytes deserialize_byte_buf deserialize_option
        deserialize_identifier
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.single()?.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_seq(Seq {
            params: self.params.iter(),
        })
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Error> {
        if len != self.params.len() {
            return Err(Error(format!(
                "expected {len} path parameters, the route has {}",
                self.params.len()
            )));
        }
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_tuple(len, visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_map(Map {
            params: self.params.iter(),
            value: None,
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_map(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }
}

struct Seq<'p, 'a> {
    params: std::slice::Iter<'p, Param<'a>>,
}

impl<'de, 'p> SeqAccess<'de> for Seq<'p, '_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        match self.params.next() {
            Some((name, value)) => seed.deserialize(Value { name, value }).map(Some),
            None => Ok(None),
        }
    }
}

struct Map<'p, 'a> {
    params: std::slice::Iter<'p, Param<'a>>,
    value: Option<Value<'p>>,
}

impl<'de> MapAccess<'de> for Map<'_, '_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.params.next() {
            Some((name, value)) => {
                self.value = Some(Value { name, value });
                seed.deserialize(name.into_deserializer()).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        match self.value.take() {
            Some(v) => seed.deserialize(v),
            None => Err(Error("value requested before key".into())),
        }
    }
}

/// One decoded parameter value.
struct Value<'p> {
    name: &'p str,
    value: &'p str,
}

impl Value<'_> {
    fn parse<T: std::str::FromStr>(&self, what: &str) -> Result<T, Error> {
        self.value.parse().map_err(|_| {
            Error(format!(
                "path parameter `{}` = {:?} is not a valid {what}",
                self.name, self.value
            ))
        })
    }
}

macro_rules! parse_value {
    ($($method:ident => $visit:ident $ty:ty,)*) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            visitor.$visit(self.parse::<$ty>(stringify!($ty))?)
        })*
    };
}

impl<'de> de::Deserializer<'de> for Value<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_str(self.value)
    }

    parse_value! {
        deserialize_bool => visit_bool bool,
        deserialize_i8 => visit_i8 i8,
        deserialize_i16 => visit_i16 i16,
        deserialize_i32 => visit_i32 i32,
        deserialize_i64 => visit_i64 i64,
        deserialize_i128 => visit_i128 i128,
        deserialize_u8 => visit_u8 u8,
        deserialize_u16 => visit_u16 u16,
        deserialize_u32 => visit_u32 u32,
        deserialize_u64 => visit_u64 u64,
        deserialize_u128 => visit_u128 u128,
        deserialize_f32 => visit_f32 f32,
        deserialize_f64 => visit_f64 f64,
        deserialize_char => visit_char char,
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_enum(self.value.into_deserializer())
    }

    forward_to_deserialize_any! {
        str string bytes byte_buf unit unit_struct seq tuple tuple_struct map struct identifier
        ignored_any
    }
}
