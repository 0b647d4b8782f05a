"""ember.ir"""
